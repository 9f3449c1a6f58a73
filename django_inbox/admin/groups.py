"""The admin's failure groups: a page listing the dead, parked and failed rows by cause
(:mod:`django_inbox.services.groups`), each group linked to the changelist filtered to its
rows, where the replay and park actions act on it (with "select all") through their usual
confirmation and audit."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode
from django.utils.translation import gettext_lazy as _

from ..models import InboxMessage
from ..services.groups import failure_groups, group_pks

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[InboxMessage]
else:  # ModelAdmin is generic only in the type stubs
    _Base = object


#: The most rows of one group the changelist lists (one query parameter each: SQLite takes
#: 32,766 in a statement); an action on them, then on the rest, covers a larger group.
MAX_GROUP_ROWS = 20_000


class GroupFilter(admin.SimpleListFilter):
    """The rows of one failure group (``?group=ID&consumer=NAME``, from the groups page). It
    offers no choices of its own: listing the groups reads every problem row."""

    title = _("failure group")
    parameter_name = "group"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value)] if value else []

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        pks = group_pks(value, consumer=request.GET.get("consumer") or None, limit=MAX_GROUP_ROWS)
        if len(pks) == MAX_GROUP_ROWS:
            messages.warning(
                request,
                f"Only the first {MAX_GROUP_ROWS:,} rows of this group are listed: act on "
                "them, then come back for the rest.",
            )
        return queryset.filter(pk__in=pks)


class GroupsViewMixin(_Base):
    """The groups page (``groups/``) of :class:`~django_inbox.admin.InboxMessageAdmin`."""

    def get_urls(self) -> list[Any]:
        urls = super().get_urls()
        view = self.admin_site.admin_view(self.groups_view)
        return [path("groups/", view, name="django_inbox_inboxmessage_groups"), *urls]

    def groups_view(self, request: HttpRequest) -> HttpResponse:
        """Every failure group, the largest first: its cause, its rows by status, when it was
        first and last seen, its newest row; a link to its rows."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        consumer = request.GET.get("consumer") or None
        changelist = reverse("admin:django_inbox_inboxmessage_changelist")
        found = failure_groups(consumer=consumer)
        groups = [
            {
                "group": group,
                "rows_url": changelist
                + "?"
                + urlencode({"consumer": group.consumer, "group": group.id}),
                "sample_url": reverse(
                    "admin:django_inbox_inboxmessage_change", args=[group.sample_pk]
                ),
            }
            for group in found
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": "Failure groups" + (f" of {consumer}" if consumer else ""),
            "opts": self.model._meta,
            "groups": groups,
            "total": sum(group.count for group in found),
        }
        return TemplateResponse(request, "admin/django_inbox/inboxmessage/groups.html", context)
