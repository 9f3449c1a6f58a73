"""``InboxMessageAdmin``: read-only rows, a health summary, and audited operator actions
(:mod:`.actions`). Lists never scan the table: filters read indexes, counts are capped or
estimated (:mod:`.paginator`), and the summary reads the indexes ``inbox_stats`` reads."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from ..conf import inbox_settings
from ..models import ATTENTION_STATUSES, InboxMessage
from ..services import by_message_id
from .actions import ACTIONS, ActionsMixin
from .columns import ColumnsMixin
from .filters import ConsumerFilter, EventTypeFilter, ReceivedFilter
from .groups import GroupFilter, GroupsViewMixin
from .guards import payload_lookup_allowed, primary_key, refuse_unstorable_query
from .keys import KeyViewMixin
from .paginator import CappedCountPaginator, InboxChangeList
from .render import pretty_json, status_badge, timeline
from .summary import summary

Status = InboxMessage.Status
#: Fields only users with ``view_payload_inboxmessage`` may see or filter the list by: the
#: payload and headers, and the error texts and history, which often quote the payload.
PAYLOAD_FIELDS = ("payload", "headers", "last_error", "history")


#: The request of the changelist being built, for ``lookup_allowed`` on Django < 5.0, which
#: does not pass it (a context variable: one admin instance serves every thread).
_changelist_request: ContextVar[HttpRequest | None] = ContextVar(
    "django_inbox_changelist_request", default=None
)

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[InboxMessage]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin


class InboxMessageAdmin(ActionsMixin, ColumnsMixin, KeyViewMixin, GroupsViewMixin, _ModelAdmin):
    # What triage needs, on the first screen at 1400 px without scrolling sideways: why a
    # message failed and when it is tried next. When it arrived is on its page (the list is
    # newest first).
    list_display = (
        "message_id",
        "consumer",
        "event_type",
        "status_display",
        "attempts_display",
        "short_error",
        "next_attempt_display",
    )
    list_display_links = ("message_id",)
    list_filter = ("status", ConsumerFilter, EventTypeFilter, ReceivedFilter, GroupFilter)
    search_fields = ("message_id",)  # searched by get_search_results, through the indexes
    search_help_text = "Exact message id; or key:VALUE, source:VALUE, pk:NUMBER."
    ordering = ("-pk",)
    sortable_by = ()
    list_per_page = 50
    list_max_show_all = 500
    show_full_result_count = False
    paginator = CappedCountPaginator
    change_list_template = "admin/django_inbox/inboxmessage/change_list.html"
    change_form_template = "admin/django_inbox/inboxmessage/change_form.html"
    if hasattr(admin, "ShowFacets"):  # Django 5.0+: facet counts would count the table
        show_facets = admin.ShowFacets.NEVER

    # --- permissions ---------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_payload_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "view_payload_inboxmessage")

    def lookup_allowed(self, lookup: str, value: str, request: Any = None) -> bool:
        # ?payload__card=… would tell a user who may not see payloads whether one matches.
        # Django < 5.0 passes no request: the changelist view's is used.
        request = request if request is not None else _changelist_request.get()
        return payload_lookup_allowed(self, super(), lookup, value, request, PAYLOAD_FIELDS)

    # --- changelist ----------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return InboxChangeList

    @admin.display(description=mark_safe('<input type="checkbox" id="action-toggle">'))
    def action_checkbox(self, obj: InboxMessage) -> SafeString:
        """The row's checkbox, as Django's own, written out: a form widget rendered through the
        template engine for each of 50 rows took a quarter of the page's time."""
        return format_html(
            '<input type="checkbox" name="{}" value="{}" class="action-select" aria-label="{}">',
            helpers.ACTION_CHECKBOX_NAME,
            obj.pk,
            f"Select this object for an action - {obj}",
        )

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: InboxMessage) -> SafeString:
        return status_badge(obj.status)

    def get_list_display(self, request: HttpRequest) -> Any:
        columns = super().get_list_display(request)
        if self.has_view_payload_permission(request):
            return columns
        return [("last_error_type" if c == "short_error" else c) for c in columns]

    def get_queryset(self, request: HttpRequest) -> QuerySet[InboxMessage]:
        # The changelist never needs the payload, headers or history of 50 rows of up to 1 MiB each.
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and (match.url_name or "").endswith("changelist"):
            queryset = queryset.defer("payload", "headers", "history")
        return queryset

    def get_ordering(self, request: HttpRequest) -> tuple[Any, ...]:
        """Newest first; dead and parked rows by when they last changed (went dead, were
        parked), read through the attention index. Ordered by id, PostgreSQL would walk the
        primary key from the newest row until it met enough dead ones: the whole table when
        they are old."""
        status = request.GET.get("status__exact") or request.GET.get("status")
        if status in ATTENTION_STATUSES:
            return ("-updated_at", "-pk")
        return tuple(self.ordering or ())

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[InboxMessage], search_term: str
    ) -> tuple[QuerySet[InboxMessage], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        field, _, value = term.partition(":")
        if value and field in ("key", "source"):
            return queryset.filter(**{field: value.strip()}), False
        if value and field == "pk":
            pk = primary_key(value.strip())
            return (queryset.filter(pk=pk) if pk is not None else queryset.none()), False
        # One probe of the unique index per consumer (on PostgreSQL), as inbox_show finds it.
        return by_message_id(queryset, [term], None), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unstorable_query(request)
        extra_context = dict(extra_context or {})
        if request.method == "GET":  # an action's POST shows its confirmation, not the list
            extra_context["inbox_summary"] = summary()
        token = _changelist_request.set(request)
        try:
            return super().changelist_view(request, extra_context)
        finally:
            _changelist_request.reset(token)

    # --- detail page ---------------------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        sensitive = self.has_view_payload_permission(request)
        payload = ("payload_display", "headers_display") if sensitive else ("payload_hidden",)
        parked: tuple[str, ...] = ()
        if obj is not None and obj.status == InboxMessage.Status.PARKED:
            parked = ("parked_display" if sensitive else "parked_redacted",)
        return [
            (
                None,
                {
                    "fields": (
                        "status_display",
                        *parked,
                        ("consumer", "event_type"),
                        "message_id",
                        ("source", "key", "sequence"),
                        "ordering_display",
                        "idempotency_key",
                    )
                },
            ),
            (
                "Attempts",
                {
                    "fields": (
                        ("attempts_display", "next_attempt_display", "locked_until_display"),
                        ("received_display", "updated_display", "processed_display"),
                        "last_error" if sensitive else "last_error_type",
                    )
                },
            ),
            ("Payload", {"fields": payload}),
            (
                "Timeline",
                {"fields": ("timeline_display" if sensitive else "timeline_redacted",)},
            ),
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return [
            name
            for fieldset in self.get_fieldsets(request, obj)
            for line in fieldset[1]["fields"]
            for name in (line if isinstance(line, tuple) else (line,))
        ]

    @admin.display(description="payload")
    def payload_display(self, obj: InboxMessage) -> SafeString:
        return pretty_json(obj.payload)

    @admin.display(description="headers")
    def headers_display(self, obj: InboxMessage) -> SafeString:
        return pretty_json(obj.headers)

    @admin.display(description="payload and headers")
    def payload_hidden(self, obj: InboxMessage) -> SafeString:
        # A constant: format_html() without arguments is deprecated (an error in Django 6.0).
        return mark_safe(
            '<p class="inbox-hidden">Hidden: payloads may hold personal data. Seeing them needs '
            "the “Can see inbox message payloads and headers” permission.</p>"
        )

    @admin.display(description="timeline")
    def timeline_display(self, obj: InboxMessage) -> SafeString:
        return timeline(obj)

    @admin.display(description="timeline")
    def timeline_redacted(self, obj: InboxMessage) -> SafeString:
        # A constant note, then the timeline without error texts (escaped by format_html).
        note = mark_safe(
            '<p class="inbox-hidden">Hidden: error messages may quote the payload. Seeing '
            "them and their tracebacks needs the “Can see inbox message payloads and "
            "headers” permission.</p>"
        )
        return note + timeline(obj, errors=False)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        refuse_unstorable_query(request)
        allowed = self.get_actions(request)
        pk = primary_key(str(object_id))
        row = (
            self.get_queryset(request)
            .filter(pk=pk)
            .values_list("status", "consumer", "key", "sequence")
            .first()
            if pk is not None
            else None
        )
        status, consumer, key, sequence = row or (None, "", "", None)
        # Skipping a version means something only for a key's version in an ordered consumer.
        skippable = bool(consumer and key and sequence) and inbox_settings.ordered(consumer)
        extra_context = {
            **(extra_context or {}),
            # Only the actions this user may run that apply to this message's status.
            "inbox_actions": [
                {"name": name, "title": spec.button}
                for name, spec in ACTIONS.items()
                if name in allowed
                and status in spec.start
                and (name != "skip_versions" or skippable)
            ],
            "changelist_url": reverse("admin:django_inbox_inboxmessage_changelist"),
        }
        return super().change_view(request, object_id, form_url, extra_context)
