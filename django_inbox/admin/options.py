"""``InboxMessageAdmin``: read-only rows, a health summary, and audited operator actions.

Actions call the same service functions as ``inbox_replay`` (:mod:`django_inbox.actions`):
each asks for confirmation (and a reason) on a page of its own, changes only the rows its
status rules allow, reports what it did with counts, and writes one ``LogEntry`` per changed
row naming the user and the reason. Each is behind its own model permission; a user without
it neither sees the action nor can run it with a forged POST (Django drops actions the user
may not run before dispatching).
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin.views.main import ChangeList
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import BadRequest
from django.db.models import QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator

from .. import services
from ..models import ATTENTION_STATUSES, InboxMessage
from ..services import (
    PROBLEM_KINDS,
    STATUSES,
    ActionResult,
    collect,
    count_by_status,
    known_consumers,
)
from .filters import ConsumerFilter, EventTypeFilter, ReceivedFilter
from .paginator import COUNT_CAP, CappedCountPaginator
from .render import error_type, pretty_json, status_badge, timeline

Status = InboxMessage.Status
PERMISSION_PREFIX = "django_inbox."
#: The summary estimates completed rows instead of counting them (a scan of the table) above
#: this many rows: a page view must not read the table (``inbox_stats`` counts up to
#: :data:`django_inbox.stats.ESTIMATE_ABOVE`).
SUMMARY_ESTIMATE_ABOVE = 100_000
#: Fields only users with ``view_payload_inboxmessage`` may see or filter the list by: the
#: payload and headers, and the error texts and history, which often quote the payload.
PAYLOAD_FIELDS = ("payload", "headers", "last_error", "history")

#: What each action does: (service call, statuses it starts from, needs a reason, verb).
ACTIONS: dict[str, dict[str, Any]] = {
    "replay_messages": {
        "title": "Replay dead or parked messages",
        "button": "Replay this message",
        "verb": "Replayed",
        "from": services.REPLAYABLE,
        "explain": "They go back to received, due now, with a fresh set of attempts; their "
        "history is kept. Completed messages are not re-run by this action.",
        "reason_required": False,
    },
    "force_rerun_messages": {
        "title": "Re-run completed messages",
        "button": "Re-run this message",
        "verb": "Re-ran",
        "from": (Status.COMPLETED,),
        "explain": "Their handlers run again, and the effects they write are applied a second "
        "time. Only do this to repair data the first run got wrong. A reason is required.",
        "reason_required": True,
    },
    "park_messages": {
        "title": "Park messages",
        "button": "Park this message",
        "verb": "Parked",
        "from": services.PARKABLE,
        "explain": "No worker takes a parked message until it is replayed.",
        "reason_required": False,
    },
    "retry_messages_now": {
        "title": "Retry failed messages now",
        "button": "Retry this message now",
        "verb": "Made due now",
        "from": services.RETRYABLE,
        "explain": "The next attempt runs as soon as a worker polls, instead of after its "
        "backoff. Attempts already made still count.",
        "reason_required": False,
    },
}


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


#: The request of the changelist being built, for ``lookup_allowed`` on Django < 5.0, which
#: does not pass it (a context variable: one admin instance serves every thread).
_changelist_request: ContextVar[HttpRequest | None] = ContextVar(
    "django_inbox_changelist_request", default=None
)

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[InboxMessage]
else:  # ModelAdmin is generic only in the type stubs
    _ModelAdmin = admin.ModelAdmin


class InboxMessageAdmin(_ModelAdmin):
    list_display = (
        "message_id",
        "consumer",
        "event_type",
        "status_display",
        "attempts",
        "received_at",
        "updated_at",
        "next_attempt_at",
        "short_error",
    )
    list_display_links = ("message_id",)
    list_filter = ("status", ConsumerFilter, EventTypeFilter, ReceivedFilter)
    search_fields = ("message_id",)  # searched by get_search_results, through the indexes
    search_help_text = (
        "Exact message id; or key:VALUE, source:VALUE, pk:NUMBER. Key and source searches "
        "read the whole table."
    )
    ordering = ("-pk",)
    sortable_by = ()
    list_per_page = 50
    list_max_show_all = 500
    show_full_result_count = False
    paginator = CappedCountPaginator
    actions = list(ACTIONS)
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

    def _has(self, request: HttpRequest, codename: str) -> bool:
        return bool(request.user.has_perm(PERMISSION_PREFIX + codename))

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "replay_inboxmessage")

    def has_force_replay_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "force_replay_inboxmessage")

    def has_park_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "park_inboxmessage")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "retry_inboxmessage")

    def has_view_payload_permission(self, request: HttpRequest) -> bool:
        return self._has(request, "view_payload_inboxmessage")

    def lookup_allowed(self, lookup: str, value: str, request: Any = None) -> bool:
        # ?payload__card=… would tell a user who may not see payloads whether one matches.
        # Django < 5.0 passes no request: the changelist view's is used.
        request = request if request is not None else _changelist_request.get()
        if lookup.split(LOOKUP_SEP, 1)[0] in PAYLOAD_FIELDS and (
            request is None or not self.has_view_payload_permission(request)
        ):
            return False
        if django.VERSION < (5, 0):  # lookup_allowed() takes the request since Django 5.0
            return bool(super().lookup_allowed(lookup, value))  # type: ignore[call-arg]
        return bool(super().lookup_allowed(lookup, value, request))

    # --- changelist ----------------------------------------------------------------------

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return InboxChangeList

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: InboxMessage) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description="last error")
    def short_error(self, obj: InboxMessage) -> str:
        return Truncator(obj.last_error).chars(80) if obj.last_error else ""

    @admin.display(description="last error")
    def last_error_type(self, obj: InboxMessage) -> str:
        return error_type(obj.last_error)

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
            number = value.strip()
            # isdigit() alone accepts "²", which int() refuses.
            # Beyond a bigint no row can match (and Django < 5.0 would send it and fail).
            valid = number.isascii() and number.isdigit() and int(number) < 2**63
            return (queryset.filter(pk=int(number)) if valid else queryset.none()), False
        # consumer = ANY(…) AND message_id = … is one probe of the unique index per consumer.
        return queryset.filter(consumer__in=known_consumers(), message_id=term), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        refuse_unstorable_query(request)
        extra_context = {**(extra_context or {}), "inbox_summary": self.summary(request)}
        token = _changelist_request.set(request)
        try:
            return super().changelist_view(request, extra_context)
        finally:
            _changelist_request.reset(token)

    def summary(self, request: HttpRequest) -> dict[str, Any]:
        """Counts per consumer and status with links, oldest due age, stuck/dead rows, problems."""
        stats = collect(ignore=(), estimate_above=SUMMARY_ESTIMATE_ABOVE)
        base = reverse("admin:django_inbox_inboxmessage_changelist")
        rows = []
        for name, consumer in sorted(stats.consumers.items()):
            cells = []
            for status in STATUSES:
                count = consumer.counts[status]
                cells.append(
                    {
                        "status": status,
                        "count": count,
                        "url": f"{base}?{urlencode({'consumer': name, 'status__exact': status})}",
                    }
                )
            rows.append(
                {
                    "consumer": name,
                    "url": f"{base}?{urlencode({'consumer': name})}",
                    "cells": cells,
                    "stuck": consumer.stuck,
                    "oldest_pending_age": consumer.oldest_pending_age,
                }
            )
        return {
            "statuses": [(status, Status(status).label) for status in STATUSES],
            "rows": rows,
            "problems": stats.problems,
            "problem_kinds": PROBLEM_KINDS,
            "completed_estimated": stats.completed_estimated,
            "max_pending_age": stats.max_pending_age,
            "at": stats.at,
        }

    # --- detail page ---------------------------------------------------------------------

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        sensitive = self.has_view_payload_permission(request)
        payload = ("payload_display", "headers_display") if sensitive else ("payload_hidden",)
        return [
            (
                None,
                {
                    "fields": (
                        "status_display",
                        ("consumer", "event_type"),
                        "message_id",
                        ("source", "key"),
                        "idempotency_key",
                    )
                },
            ),
            (
                "Attempts",
                {
                    "fields": (
                        ("attempts", "next_attempt_at", "locked_until"),
                        ("received_at", "updated_at", "processed_at"),
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
        status = (
            self.get_queryset(request).filter(pk=object_id).values_list("status", flat=True).first()
            if str(object_id).isdigit()
            else None
        )
        extra_context = {
            **(extra_context or {}),
            # Only the actions this user may run that apply to this message's status.
            "inbox_actions": [
                {"name": name, "title": spec["button"]}
                for name, spec in ACTIONS.items()
                if name in allowed and status in spec["from"]
            ],
            "changelist_url": reverse("admin:django_inbox_inboxmessage_changelist"),
        }
        return super().change_view(request, object_id, form_url, extra_context)

    # --- actions -------------------------------------------------------------------------

    @admin.action(permissions=["replay"], description="Replay dead or parked messages")
    def replay_messages(self, request: HttpRequest, queryset: QuerySet[InboxMessage]) -> Any:
        return self._confirm_and_run(
            request,
            queryset,
            "replay_messages",
            lambda rows, actor, reason: services.replay(
                rows, actor=actor, reason=reason, via="admin", keep=None
            ),
        )

    @admin.action(permissions=["force_replay"], description="Re-run completed messages (force)")
    def force_rerun_messages(self, request: HttpRequest, queryset: QuerySet[InboxMessage]) -> Any:
        return self._confirm_and_run(
            request,
            queryset.filter(status=Status.COMPLETED),
            "force_rerun_messages",
            lambda rows, actor, reason: services.replay(
                rows, actor=actor, reason=reason, force=True, via="admin", keep=None
            ),
            refused_elsewhere=queryset.exclude(status=Status.COMPLETED),
        )

    @admin.action(permissions=["park"], description="Park messages")
    def park_messages(self, request: HttpRequest, queryset: QuerySet[InboxMessage]) -> Any:
        return self._confirm_and_run(
            request,
            queryset,
            "park_messages",
            lambda rows, actor, reason: services.park(
                rows, actor=actor, reason=reason, via="admin", keep=None
            ),
        )

    @admin.action(permissions=["retry"], description="Retry failed messages now")
    def retry_messages_now(self, request: HttpRequest, queryset: QuerySet[InboxMessage]) -> Any:
        return self._confirm_and_run(
            request,
            queryset,
            "retry_messages_now",
            lambda rows, actor, reason: services.retry_now(
                rows, actor=actor, reason=reason, via="admin", keep=None
            ),
        )

    def _confirm_and_run(
        self,
        request: HttpRequest,
        queryset: QuerySet[InboxMessage],
        name: str,
        run: Callable[[QuerySet[InboxMessage], str, str], ActionResult],
        refused_elsewhere: QuerySet[InboxMessage] | None = None,
    ) -> TemplateResponse | None:
        spec = ACTIONS[name]
        reason = request.POST.get("reason", "").strip()
        error = ""
        if request.POST.get("confirm") == "yes":
            if spec["reason_required"] and not reason:
                error = "Say why: a reason is required for this action."
            else:
                # Counted before the run: afterwards the re-run rows are no longer completed.
                elsewhere = (
                    count_by_status(refused_elsewhere) if refused_elsewhere is not None else {}
                )
                result = run(queryset, actor_of(request), reason)
                for status, count in elsewhere.items():
                    result.refused[f"{status} (not completed)"] += count
                self._audit(request, result, spec, reason)
                self._report(request, result, spec)
                return None
        counts = count_by_status(queryset)
        if refused_elsewhere is not None:
            for status, count in count_by_status(refused_elsewhere).items():
                counts[status] = counts.get(status, 0) + count
        eligible = sum(n for status, n in counts.items() if status in spec["from"])
        context = {
            **self.admin_site.each_context(request),
            "title": spec["title"],
            "opts": self.model._meta,
            "action_name": name,
            "spec": spec,
            "counts": sorted(counts.items()),
            "eligible": eligible,
            "ineligible": sum(counts.values()) - eligible,
            "from_statuses": ", ".join(str(s) for s in spec["from"]),
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across", "0"),
            "reason": reason,
            "error": error,
            "media": self.media,
        }
        return TemplateResponse(
            request, "admin/django_inbox/inboxmessage/action_confirmation.html", context
        )

    def _audit(
        self, request: HttpRequest, result: ActionResult, spec: dict[str, Any], reason: str
    ) -> None:
        """One ``LogEntry`` per changed row: who, what, from which status, why."""
        content_type = ContentType.objects.get_for_model(InboxMessage, for_concrete_model=False)
        entries = [
            LogEntry(
                user_id=int(request.user.pk or 0),
                content_type_id=content_type.pk,
                object_id=str(pk),
                object_repr=Truncator(f"{consumer}:{message_id}").chars(200),
                action_flag=CHANGE,
                change_message=f"{spec['verb']} (was {status})"
                + (f". Reason: {reason}" if reason else ""),
            )
            for pk, consumer, message_id, status in result.rows
        ]
        LogEntry.objects.bulk_create(entries, batch_size=1000)

    def _report(self, request: HttpRequest, result: ActionResult, spec: dict[str, Any]) -> None:
        counts = ", ".join(f"{n:,} {status}" for status, n in sorted(result.changed.items()))
        if result.total:
            self.message_user(
                request,
                f"{spec['verb']} {result.total:,} message(s) ({counts}).",
                messages.SUCCESS,
            )
        else:
            self.message_user(request, f"{spec['verb']} no message.", messages.WARNING)
        if result.refused:
            refused = "; ".join(f"{n:,} {why}" for why, n in sorted(result.refused.items()))
            self.message_user(request, f"Left unchanged: {refused}.", messages.WARNING)


def refuse_unstorable_query(request: HttpRequest) -> None:
    """A NUL in the query string can match no row, and PostgreSQL refuses it in a query:
    answer 400 instead of a server error."""
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in value for value in values):
            raise BadRequest("the query string contains a NUL character")


def actor_of(request: HttpRequest) -> str:
    user = request.user
    return f"{user.get_username()} (admin user {user.pk})"
