"""The outbox's admin: what is pending, sent and dead, and a replay of dead rows."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import clock
from ..admin.actions import Action, ConfirmedActions, confirmed_action
from ..admin.filters import ExactFilter
from ..admin.guards import payload_lookup_allowed, refuse_unstorable_query
from ..admin.paginator import CappedCountPaginator, InboxChangeList
from ..admin.render import pretty_json
from ..conf import inbox_settings
from . import services
from .admin_display import DisplayMixin, summary
from .models import OutboxMessage

#: Fields only users with view_payload_outboxmessage may see or filter on (an error's text may
#: quote the payload).
PAYLOAD_FIELDS = ("payload", "headers", "last_error")

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[OutboxMessage]
else:  # ModelAdmin is generic only in the type stubs
    _Base = admin.ModelAdmin


#: The event type filter offers the types of this many of the newest rows.
RECENT_ROWS = 1000


class RecentEventTypeFilter(ExactFilter):
    """By event type, offering the types of the newest :data:`RECENT_ROWS` rows (a walk of the
    primary key from its end). Django's own filter would read the whole table for its
    ``DISTINCT`` on every page."""

    title = "event type"
    parameter_name = "event_type"

    def offered(self, request: HttpRequest, model_admin: Any) -> set[str]:
        newest = model_admin.get_queryset(request).order_by("-pk")
        return set(newest.values_list("event_type", flat=True)[:RECENT_ROWS])


ACTIONS = {
    "replay_dead": Action(
        permission="replay",
        description="Replay dead outbox messages",
        title="Replay dead outbox messages",
        button="Replay this message",
        verb="Replayed",
        start=services.REPLAYABLE,
        run=services.replay_dead,
        reason_required=True,
        noun="outbox message",
        done="A relay publishes them again with the same message id.",
        explain="They go back to pending with a fresh set of attempts and the same message "
        "id: a relay publishes them again, and the receiving inbox deduplicates a copy it "
        "already has. A key's messages go out one at a time, in the order written. A reason "
        "is required; it is kept in the admin log, with who replayed each message.",
    ),
}


class OutboxMessageAdmin(ConfirmedActions, DisplayMixin, _Base):
    list_display = (
        "message_id",
        "event_type",
        "status_display",
        "destination_display",
        "key",
        "attempts",
        "error",
        "age",
        "cause",
    )
    change_list_template = "admin/django_inbox_outbox/outboxmessage/change_list.html"
    change_form_template = "admin/django_inbox_outbox/outboxmessage/change_form.html"
    list_filter = ("status", RecentEventTypeFilter)
    search_fields = ("message_id",)  # searched by get_search_results, through the indexes
    search_help_text = (
        "Exact message id; or key:VALUE, cause:MESSAGE_ID (the inbox message that published "
        "it). Key and cause searches read the whole table, but for a key's pending rows."
    )
    ordering = ("-id",)
    sortable_by = ()
    actions = ("replay_dead",)
    action_specs = ACTIONS
    replay_dead = confirmed_action(ACTIONS, "replay_dead")
    show_full_result_count = False
    paginator = CappedCountPaginator
    if hasattr(admin, "ShowFacets"):  # Django 5.0+: "Show counts" would count the whole table
        show_facets = admin.ShowFacets.NEVER
    readonly_fields = (
        "message_id",
        "event_type",
        "status_display",
        "destination_display",
        "key",
        "attempts",
        "last_error",
        "created_display",
        "next_attempt_display",
        "sent_display",
        "cause_link",
        "timeline_display",
    )

    def get_fields(self, request: HttpRequest, obj: OutboxMessage | None = None) -> Any:
        fields = list(self.readonly_fields)
        if request.user.has_perm("django_inbox_outbox.view_payload_outboxmessage"):
            fields += ["payload_shown", "headers_shown"]
        else:  # errors without their texts, which may quote the payload, as the inbox's
            fields[fields.index("timeline_display")] = "timeline_redacted"
            fields[fields.index("last_error")] = "error_type"
        return fields

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = super().get_list_display(request)
        if request.user.has_perm("django_inbox_outbox.view_payload_outboxmessage"):
            return columns
        return [("error_type" if column == "error" else column) for column in columns]

    @admin.display(description="payload")
    def payload_shown(self, obj: OutboxMessage) -> SafeString:
        return pretty_json(obj.payload)  # a value no process can decode: its stored text

    @admin.display(description="headers")
    def headers_shown(self, obj: OutboxMessage) -> SafeString:
        return pretty_json(obj.headers)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.get_fields(request, obj)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_inbox_outbox.replay_outboxmessage")

    def has_view_payload_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_inbox_outbox.view_payload_outboxmessage")

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return InboxChangeList

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[OutboxMessage], search_term: str
    ) -> tuple[QuerySet[OutboxMessage], bool]:
        """Exact lookups (Django's ``=field`` is case-insensitive: ``UPPER(…)``, no index)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        field, _, value = term.partition(":")
        if value and field == "key":
            return queryset.filter(key=value.strip()), False
        if value and field == "cause":
            return queryset.filter(causation_message_id=value.strip()), False
        return queryset.filter(message_id=term), False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        refuse_unstorable_query(request)  # a NUL in a filter: 400, not a database error
        self._request = request  # lookup_allowed() of Django < 5.0 gets no request
        extra_context = dict(extra_context or {})
        if request.method == "GET":  # an action's POST shows its confirmation, not the list
            extra_context["outbox_summary"] = summary()
        return super().changelist_view(request, extra_context)

    def lookup_allowed(self, lookup: str, value: str, request: Any = None) -> bool:
        # ?payload__card__startswith=… would tell a user who may not see payloads whether
        # one matches.
        request = request if request is not None else getattr(self, "_request", None)
        return payload_lookup_allowed(self, super(), lookup, value, request, PAYLOAD_FIELDS)

    def get_queryset(self, request: HttpRequest) -> QuerySet[OutboxMessage]:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("changelist"):
            queryset = queryset.defer("payload", "headers")  # up to 1 MiB each, not shown
        return queryset

    @admin.display(description="age")
    def age(self, row: OutboxMessage) -> str:
        seconds = (clock.now() - row.created_at).total_seconds()
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size:
                return f"{seconds / size:.0f}{unit}"
        return f"{seconds:.0f}s"

    @admin.display(description="last error")
    def error(self, row: OutboxMessage) -> str:
        if row.status == OutboxMessage.Status.PENDING and row.next_attempt_at is None:
            return "held: an earlier message of its key is not sent yet"
        return row.last_error[:120]

    @admin.display(description="caused by")
    def cause(self, row: OutboxMessage) -> str:
        if not row.causation_message_id:
            return ""
        url = reverse("admin:django_inbox_inboxmessage_changelist")
        query = urlencode({"q": row.causation_message_id})
        return format_html(
            '<a href="{}?{}">{} {}</a>',
            url,
            query,
            row.causation_consumer,
            row.causation_message_id,
        )


if inbox_settings.admin and not admin.site.is_registered(OutboxMessage):
    admin.site.register(OutboxMessage, OutboxMessageAdmin)
