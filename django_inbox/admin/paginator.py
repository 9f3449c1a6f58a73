"""A paginator that never counts millions of rows."""

from __future__ import annotations

from typing import Any

from django.core.paginator import Paginator
from django.utils.functional import cached_property

from ..stats import estimated_rows

#: Filtered lists are counted up to this many rows; beyond it the count says "more than".
COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):  # type: ignore[type-arg]
    """Unfiltered lists use PostgreSQL's estimate of the table size; filtered ones are counted
    up to :data:`COUNT_CAP` rows (``SELECT count(*) FROM (… LIMIT n)``), so a page never waits
    for a full count. :attr:`is_estimate` says when the count is not exact."""

    is_estimate = False

    @cached_property
    def count(self) -> int:
        queryset: Any = self.object_list
        query = getattr(queryset, "query", None)
        if query is not None and not query.where:
            estimate = estimated_rows(queryset.db)
            if estimate > COUNT_CAP:
                self.is_estimate = True
                return estimate
        if query is None:
            return len(queryset)
        count = queryset[: COUNT_CAP + 1].count()
        if count > COUNT_CAP:
            self.is_estimate = True
        return int(count)
