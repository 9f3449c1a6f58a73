"""HTML pieces of the admin pages. Everything from a message is escaped (``format_html``)."""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..models import InboxMessage
from ..services import shown_json
from ..wording import counted
from .columns import error_type as error_type
from .columns import when_text

#: Symbol shown before each status, so the status reads without colour too.
STATUS_SYMBOLS = {
    "received": "○",
    "in_progress": "◐",
    "completed": "✓",
    "failed": "↻",
    "dead": "✗",
    "parked": "‖",
    "waiting": "…",
    "skipped": "↷",
    "pending": "○",
    "sent": "✓",
}


def status_badge(status: str) -> SafeString:
    label = InboxMessage.Status(status).label if status in InboxMessage.Status.values else status
    return format_html(
        '<span class="inbox-status inbox-status-{}">{} {}</span>',
        status,
        STATUS_SYMBOLS.get(status, "•"),
        label,
    )


def pretty_json(value: Any) -> SafeString:
    """``value`` indented; one this process cannot decode or indent shown as it can be, with
    why (:func:`~django_inbox.services.shown_json`)."""
    shown = shown_json(value, indent=2, sort_keys=True)
    if shown.note is None:
        return format_html('<pre class="inbox-json">{}</pre>', shown.text)
    if not shown.text:
        return format_html('<p class="inbox-hidden">{}</p>', shown.note)
    return format_html(
        '<p class="inbox-hidden">{}</p><pre class="inbox-json">{}</pre>', shown.note, shown.text
    )


def _error_item(entry: dict[str, Any], *, errors: bool) -> SafeString:
    retry = (
        format_html(" — next attempt at {}", when_text(entry.get("retry_at")))
        if entry.get("retry_at")
        else ""
    )
    text: SafeString | str = ""  # error messages and tracebacks may quote the payload
    if errors:
        text = format_html(": {}", entry.get("message", ""))
        if entry.get("traceback"):
            text += format_html(
                '<details><summary>Traceback</summary><pre class="inbox-traceback">{}</pre>'
                "</details>",
                entry["traceback"],
            )
    return format_html(
        '<li class="inbox-event inbox-event-error"><time>{}</time> '
        "<strong>Attempt {} failed</strong> → {}{}<br><code>{}</code>{}</li>",
        when_text(entry.get("at")),
        entry.get("attempt", "?"),
        entry.get("outcome", ""),
        retry,
        entry.get("type", ""),
        text,
    )


def _interrupted_item(entry: dict[str, Any], *, errors: bool) -> SafeString:
    return format_html(
        '<li class="inbox-event inbox-event-interrupted"><time>{}</time> '
        "<strong>Attempt {} interrupted</strong> (not counted){}</li>",
        when_text(entry.get("at")),
        entry.get("attempt", "?"),
        format_html(": {}", entry.get("message", "")) if errors else "",
    )


_ACTION_VERBS = {"replay": "Replayed", "park": "Parked", "retry": "Retry now", "skip": "Skipped"}
#: History entries the ordering writes (no actor): their headline.
_ORDERING_KINDS = {"gap": "Parked: a gap", "past_gap": "Ran past the gap"}


def _action_item(entry: dict[str, Any]) -> SafeString:
    reason = format_html(": “{}”", entry["reason"]) if entry.get("reason") else ""
    return format_html(
        '<li class="inbox-event inbox-event-action"><time>{}</time> <strong>{}</strong> '
        "by {} via {} (was {}, {}){}</li>",
        when_text(entry.get("at")),
        _ACTION_VERBS.get(entry.get("kind", ""), entry.get("kind", "")),
        entry.get("by", "?"),
        entry.get("via", "?"),
        entry.get("from", "?"),
        _attempts(entry.get("attempts")),
        reason,
    )


def _attempts(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return counted(value, "attempt")
    return "? attempts"


def timeline(message: InboxMessage, *, errors: bool = True) -> SafeString:
    """Received, every failed attempt (with traceback), every operator action, completion.

    ``errors=False`` leaves out error messages and tracebacks (for users who may not see
    payloads: an error often quotes one), keeping each failure's class and time.
    """
    items: list[SafeString] = [
        format_html(
            '<li class="inbox-event"><time>{}</time> <strong>Received</strong>{}</li>',
            when_text(message.received_at),
            format_html(" from {}", message.source) if message.source else "",
        )
    ]
    for entry in message.history:
        if entry.get("kind") == "error":
            items.append(_error_item(entry, errors=errors))
        elif entry.get("kind") == "interrupted":
            items.append(_interrupted_item(entry, errors=errors))
        elif entry.get("kind") == "unreadable":
            items.append(
                format_html(
                    '<li class="inbox-event"><strong>An entry that is not one of the inbox\'s'
                    "</strong>{}</li>",
                    format_html(": <code>{}</code>", entry.get("stored", "")) if errors else "",
                )
            )
        elif entry.get("kind") in _ORDERING_KINDS:
            items.append(
                format_html(
                    '<li class="inbox-event"><time>{}</time> <strong>{}</strong>: {}</li>',
                    when_text(entry.get("at")),
                    _ORDERING_KINDS[entry["kind"]],
                    entry.get("message", ""),
                )
            )
        else:
            items.append(_action_item(entry))
    if message.processed_at is not None:
        items.append(
            format_html(
                '<li class="inbox-event inbox-event-done"><time>{}</time> '
                "<strong>Completed</strong> on attempt {}</li>",
                when_text(message.processed_at),
                message.attempts,
            )
        )
    elif message.status == InboxMessage.Status.IN_PROGRESS:
        items.append(
            format_html(
                '<li class="inbox-event"><strong>Attempt {} running</strong>, lease until {}</li>',
                message.attempts,
                when_text(message.locked_until),
            )
        )
    return format_html(
        '<ol class="inbox-timeline">{}</ol>', format_html_join("", "{}", ((i,) for i in items))
    )


def key_versions(consumer: str, key: str, limit: int) -> dict[str, Any]:
    """One key of an ordered consumer: its applied sequence and its versions (the messages
    with a sequence) in sequence order, for the admin's key view.

    Read through the sequence index, whose rows are those with a sequence: the test
    ``sequence IS NOT NULL`` lets PostgreSQL use it (without it, the view read the table). A
    key's messages without a sequence are no versions and are not listed; the view links to
    the changelist's ``key:`` search for them.
    """
    from ..conf import inbox_settings
    from ..models import InboxKey

    state = InboxKey.objects.filter(consumer=consumer, key=key).first()
    first = inbox_settings.policy(consumer).first_sequence
    applied = first - 1 if state is None else state.applied_sequence
    rows = list(
        InboxMessage.objects.filter(consumer=consumer, key=key, sequence__isnull=False)
        .order_by("sequence", "pk")
        .only("pk", "message_id", "sequence", "status", "event_type", "received_at", "updated_at")[
            : limit + 1
        ]
    )
    return {
        "consumer": consumer,
        "key": key,
        "applied": applied if applied >= first else None,
        "next": applied + 1,
        "rows": [
            {
                "url": reverse("admin:django_inbox_inboxmessage_change", args=[row.pk]),
                "row": row,
                "status": status_badge(row.status),
            }
            for row in rows[:limit]
        ],
        "more": len(rows) > limit,
    }
