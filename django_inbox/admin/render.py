"""HTML pieces of the admin pages. Everything from a message is escaped (``format_html``)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..models import InboxMessage

#: Symbol shown before each status, so the status reads without colour too.
STATUS_SYMBOLS = {
    "received": "○",
    "in_progress": "◐",
    "completed": "✓",
    "failed": "↻",
    "dead": "✗",
    "parked": "‖",
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
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
    return format_html('<pre class="inbox-json">{}</pre>', text)


def _when(value: str | datetime | None) -> str:
    if value is None:
        return ""
    moment = parse_datetime(value) if isinstance(value, str) else value
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else str(value)


def _error_item(entry: dict[str, Any]) -> SafeString:
    retry = (
        format_html(" — next attempt at {}", _when(entry.get("retry_at")))
        if entry.get("retry_at")
        else ""
    )
    traceback = (
        format_html(
            '<details><summary>Traceback</summary><pre class="inbox-traceback">{}</pre></details>',
            entry["traceback"],
        )
        if entry.get("traceback")
        else ""
    )
    return format_html(
        '<li class="inbox-event inbox-event-error"><time>{}</time> '
        "<strong>Attempt {} failed</strong> → {}{}<br><code>{}</code>: {}{}</li>",
        _when(entry.get("at")),
        entry.get("attempt", "?"),
        entry.get("outcome", ""),
        retry,
        entry.get("type", ""),
        entry.get("message", ""),
        traceback,
    )


_ACTION_VERBS = {"replay": "Replayed", "park": "Parked", "retry": "Retry now"}


def _action_item(entry: dict[str, Any]) -> SafeString:
    reason = format_html(": “{}”", entry["reason"]) if entry.get("reason") else ""
    return format_html(
        '<li class="inbox-event inbox-event-action"><time>{}</time> <strong>{}</strong> '
        "by {} via {} (was {}, {} attempts){}</li>",
        _when(entry.get("at")),
        _ACTION_VERBS.get(entry.get("kind", ""), entry.get("kind", "")),
        entry.get("by", "?"),
        entry.get("via", "?"),
        entry.get("from", "?"),
        entry.get("attempts", "?"),
        reason,
    )


def timeline(message: InboxMessage) -> SafeString:
    """Received, every failed attempt (with traceback), every operator action, completion."""
    items: list[SafeString] = [
        format_html(
            '<li class="inbox-event"><time>{}</time> <strong>Received</strong>{}</li>',
            _when(message.received_at),
            format_html(" from {}", message.source) if message.source else "",
        )
    ]
    for entry in message.history:
        if entry.get("kind") == "error":
            items.append(_error_item(entry))
        else:
            items.append(_action_item(entry))
    if message.processed_at is not None:
        items.append(
            format_html(
                '<li class="inbox-event inbox-event-done"><time>{}</time> '
                "<strong>Completed</strong> on attempt {}</li>",
                _when(message.processed_at),
                message.attempts,
            )
        )
    elif message.status == InboxMessage.Status.IN_PROGRESS:
        items.append(
            format_html(
                '<li class="inbox-event"><strong>Attempt {} running</strong>, lease until {}</li>',
                message.attempts,
                _when(message.locked_until),
            )
        )
    return format_html(
        '<ol class="inbox-timeline">{}</ol>', format_html_join("", "{}", ((i,) for i in items))
    )
