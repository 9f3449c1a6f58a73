"""A paginator that never counts millions of rows."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.main import ChangeList
from django.core.paginator import Paginator
from django.http import HttpRequest
from django.utils.functional import cached_property

from ..services.stats import estimated_rows

#: Filtered lists are counted up to this many rows; beyond it the count says "more than".
COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Unfiltered lists use PostgreSQL's estimate of the table size; filtered ones are counted
    up to :data:`COUNT_CAP` rows (``SELECT count(*) FROM (… LIMIT n)``), so a page never waits
    for a full count. :attr:`is_estimate` says when the count is not exact, :attr:`is_capped`
    when it stopped at the cap."""

    is_estimate = False
    #: The list has more than :data:`COUNT_CAP` rows; how many more was not counted.
    is_capped = False

    @cached_property
    def count(self) -> int:
        queryset: Any = self.object_list
        query = getattr(queryset, "query", None)
        if query is not None and not query.where:
            estimate = estimated_rows(queryset.db, queryset.model._meta.db_table)
            if estimate > COUNT_CAP:
                self.is_estimate = True
                return estimate
        if query is None:
            return len(queryset)
        # Without the list's ORDER BY: the count stops at the cap's row wherever it finds it,
        # instead of sorting every match first (a full scan when the filter has no index).
        count = queryset.order_by()[: COUNT_CAP + 1].count()
        if count > COUNT_CAP:
            self.is_estimate = self.is_capped = True
        return int(count)


class InboxChangeList(ChangeList):
    """Remembers whether the paginator's count is an estimate, for the pagination line, and
    sorts only by the columns in ``sortable_by``."""

    def get_ordering_field(self, field_name: Any) -> Any:
        # Django hides the sort links of columns not in sortable_by but still obeys ?o=N, which
        # would sort the whole table by an unindexed column.
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.count_is_estimate = getattr(self.paginator, "is_estimate", False)
        # More rows than were counted: the line says "more than COUNT_CAP", not "~count".
        self.count_is_capped = getattr(self.paginator, "is_capped", False)
        self.count_cap = COUNT_CAP
