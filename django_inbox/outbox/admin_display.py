"""What the outbox's admin shows, in the inbox admin's style: status badges, the destination,
times in UTC with seconds, the summary above the list (counts bounded as ``inbox_stats``'s, the
relay's lag, the problems), a timeline on a message's page, and a link to the inbox message
whose handler wrote it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..admin.columns import error_type as kind_of_error
from ..admin.columns import when_html, when_text
from ..admin.render import status_badge
from ..conf import inbox_settings
from ..db.counting import EXACT_UP_TO
from ..models import InboxMessage
from . import health
from .models import OutboxMessage

Status = OutboxMessage.Status


def destination(row: OutboxMessage) -> str:
    """``exchange → routing key``; the default exchange (``""``) routes by queue name."""
    return f"{row.exchange or '(default exchange)'} → {row.routing_key}"


def summary() -> dict[str, Any]:
    """The counts (bounded: estimated beyond 10,000, marked), the oldest pending row's age and
    the problems ``inbox_stats`` reports of the outbox."""
    stats = health.collect()
    problems = health.problems(stats, inbox_settings.max_pending_age)
    base = reverse("admin:django_inbox_outbox_outboxmessage_changelist")
    cells = [
        {
            "status": status,
            "count": count,
            "estimated": estimated,
            "url": f"{base}?status__exact={status}",
        }
        for status, count, estimated in (
            (Status.PENDING, stats.pending, stats.pending_estimated),
            (Status.SENT, stats.sent, stats.sent_estimated),
            (Status.DEAD, stats.dead, stats.dead_estimated),
        )
    ]
    return {
        "cells": cells,
        "oldest_pending_age": stats.oldest_pending_age,
        "last_sent_age": stats.last_sent_age,
        "problems": [message for _kind, _value, message in problems],
        "exact_up_to": EXACT_UP_TO,
        "estimated": any(cell["estimated"] for cell in cells),
    }


def timeline(row: OutboxMessage, *, errors: bool = True) -> SafeString:
    """Written (by which inbox message), attempts, and sent, dead or the next attempt; the
    last error only where ``errors`` (it may quote the payload)."""
    items: list[tuple[str, str, SafeString | str]] = [
        (when_text(row.created_at), "Written", format_html(" to {}", destination(row)))
    ]
    if row.attempts:
        error = format_html(": {}", row.last_error) if row.last_error and errors else ""
        failed = row.attempts - (1 if row.status == Status.SENT else 0)
        if failed:
            items.append((when_text(row.updated_at), f"{failed} attempt(s) failed", error or ""))
    if row.status == Status.SENT:
        items.append((when_text(row.sent_at), "Sent", f" on attempt {row.attempts}"))
    elif row.status == Status.DEAD:
        items.append((when_text(row.updated_at), "Dead", ": no more attempts"))
    elif row.next_attempt_at is None:
        items.append(("", "Held", ": an earlier message of its key is not sent yet"))
    else:
        items.append((when_text(row.next_attempt_at), "Next attempt", ""))
    return format_html(
        '<ol class="inbox-timeline">{}</ol>',
        format_html_join(
            "",
            '<li class="inbox-event"><time>{}</time> <strong>{}</strong>{}</li>',
            items,
        ),
    )


class DisplayMixin:
    """The columns and fields of :class:`~django_inbox.outbox.admin.OutboxMessageAdmin`."""

    @admin.display(description="status", ordering="status")
    def status_display(self, row: OutboxMessage) -> SafeString:
        return status_badge(row.status)

    @admin.display(description="destination")
    def destination_display(self, row: OutboxMessage) -> str:
        return destination(row)

    @admin.display(description="written")
    def created_display(self, row: OutboxMessage) -> SafeString | str:
        return when_html(row.created_at)

    @admin.display(description="sent")
    def sent_display(self, row: OutboxMessage) -> SafeString | str:
        return when_html(row.sent_at)

    @admin.display(description="next attempt")
    def next_attempt_display(self, row: OutboxMessage) -> SafeString | str:
        return when_html(row.next_attempt_at if row.status == Status.PENDING else None)

    @admin.display(description="timeline")
    def timeline_display(self, row: OutboxMessage) -> SafeString:
        return timeline(row)

    @admin.display(description="last error")
    def error_type(self, row: OutboxMessage) -> str:
        """The error's kind only (``unroutable``, an exception's class): its text may quote
        the payload."""
        if row.status == Status.PENDING and row.next_attempt_at is None:
            return "held: an earlier message of its key is not sent yet"
        return kind_of_error(row.last_error)

    @admin.display(description="timeline")
    def timeline_redacted(self, row: OutboxMessage) -> SafeString:
        return timeline(row, errors=False)

    @admin.display(description="written by")
    def cause_link(self, row: OutboxMessage) -> SafeString | str:
        """The inbox message whose handler wrote it: its page (one probe of the unique index)."""
        if not row.causation_message_id:
            return "-"
        found = (
            InboxMessage.objects.using(inbox_settings.database)
            .filter(consumer=row.causation_consumer, message_id=row.causation_message_id)
            .values_list("pk", flat=True)
            .first()
        )
        label = f"{row.causation_consumer} · {row.causation_message_id}"
        if found is None:  # purged since
            return f"{label} (no longer kept)"
        url = reverse("admin:django_inbox_inboxmessage_change", args=[found])
        return format_html('<a href="{}">{}</a>', url, label)
