"""What the admin's list and detail page show of a message, in one style: times in UTC with
seconds (``2026-11-29 08:22:09 UTC``, as the timeline and the logs write them), attempts out of
the consumer's maximum, the cause of a failure cut at a word boundary, and the next attempt
only where one will be made."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..conf import inbox_settings
from ..models import InboxMessage

Status = InboxMessage.Status

#: The longest cause the list shows; the rest is in the cell's title and on the detail page.
CAUSE_CHARS = 90
#: Statuses whose ``next_attempt_at`` is an attempt to come (for ``in_progress`` rows it is the
#: end of the running attempt's lease; finished rows have none).
NEXT_ATTEMPT_STATUSES = (Status.RECEIVED, Status.FAILED, Status.WAITING)


def when_text(value: str | datetime | None) -> str:
    """``2026-11-29 08:22:09 UTC``; ``""`` for none; a string that is no time, as it is."""
    if value is None:
        return ""
    if not isinstance(value, str | datetime):  # a history entry written by hand
        return str(value)
    try:
        moment = parse_datetime(value) if isinstance(value, str) else value
    except (ValueError, TypeError):
        return str(value)
    if moment is None:
        return str(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def when_html(value: datetime | None) -> SafeString | str:
    """A ``<time>`` element in :func:`when_text`'s style (``-`` when there is none)."""
    if value is None:
        return "-"
    return format_html(
        '<time datetime="{}" class="inbox-when">{}</time>', value.isoformat(), when_text(value)
    )


def error_type(last_error: str) -> str:
    """The exception's class of a ``last_error`` line (``"Type: message"``)."""
    return last_error.split(":", 1)[0].strip()


def shortened(text: str, limit: int = CAUSE_CHARS) -> str:
    """``text`` on one line, cut at the last word boundary before ``limit`` characters."""
    line = " ".join(text.split())
    if len(line) <= limit:
        return line
    cut = line[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "…"


def attempts_text(message: InboxMessage) -> str:
    """``3 of 5``: the attempts made and the consumer's maximum."""
    return f"{message.attempts} of {inbox_settings.policy(message.consumer).max_attempts}"


if TYPE_CHECKING:
    _Base = admin.ModelAdmin[InboxMessage]
else:  # ModelAdmin is generic only in the type stubs
    _Base = object


class ColumnsMixin(_Base):
    """The columns and read-only fields of :class:`~django_inbox.admin.InboxMessageAdmin`."""

    def has_view_payload_permission(self, request: Any) -> bool:  # defined by the admin
        raise NotImplementedError

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: InboxMessage) -> str:
        return attempts_text(obj)

    @admin.display(description="cause")
    def short_error(self, obj: InboxMessage) -> SafeString | str:
        if not obj.last_error:
            return ""
        return format_html(
            '<span class="inbox-cause" title="{}">{}</span>',
            obj.last_error[:2000],
            shortened(obj.last_error),
        )

    @admin.display(description="cause")
    def last_error_type(self, obj: InboxMessage) -> str:
        return error_type(obj.last_error)

    @admin.display(description="next attempt")
    def next_attempt_display(self, obj: InboxMessage) -> SafeString | str:
        if obj.status not in NEXT_ATTEMPT_STATUSES:
            return "-"
        return when_html(obj.next_attempt_at)

    @admin.display(description="received")
    def received_display(self, obj: InboxMessage) -> SafeString | str:
        return when_html(obj.received_at)

    @admin.display(description="changed")
    def updated_display(self, obj: InboxMessage) -> SafeString | str:
        return when_html(obj.updated_at)

    @admin.display(description="processed")
    def processed_display(self, obj: InboxMessage) -> SafeString | str:
        return when_html(obj.processed_at)

    @admin.display(description="parked by")
    def parked_display(self, obj: InboxMessage) -> str:
        return parked_by(obj)

    @admin.display(description="parked by")
    def parked_redacted(self, obj: InboxMessage) -> str:
        return parked_by(obj, errors=False)

    @admin.display(description="lease until")
    def locked_until_display(self, obj: InboxMessage) -> SafeString | str:
        return when_html(obj.locked_until if obj.status == Status.IN_PROGRESS else None)


def parked_by(message: InboxMessage, *, errors: bool = True) -> str:
    """Who parked a ``parked`` message and why, from its history: an operator (who, through
    what, the reason), the ordering (a gap), or its handler (the exception, and its message
    where ``errors``: it may quote the payload)."""
    for entry in reversed(message.history):
        kind = entry.get("kind")
        if kind == "park":
            reason = f": “{entry['reason']}”" if entry.get("reason") else ""
            return f"an operator, {entry.get('by', '?')} via {entry.get('via', '?')}{reason}"
        if kind == "gap":
            return f"the ordering, a gap: {entry.get('message', '')}".rstrip(": ")
        if kind == "error" and entry.get("outcome") == Status.PARKED:
            cause = entry.get("type", "?")
            if errors and entry.get("message"):
                cause = f"{cause}: {entry['message']}"
            return f"its handler ({cause})"
    return "unknown (no history entry says)"
