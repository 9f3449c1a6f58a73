"""Operations on outbox rows, for the admin, commands and your own code."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, Min, QuerySet
from django.utils import timezone

from ..conf import inbox_settings
from .models import OutboxMessage
from .settings import outbox_settings

Status = OutboxMessage.Status


def replay(rows: QuerySet[OutboxMessage]) -> int:
    """Send the ``dead`` rows among ``rows`` back to ``pending``, due now, with a fresh set of
    attempts and the same message id (the receiver deduplicates a copy it already has).
    Returns how many rows changed."""
    now = timezone.now()
    return (
        rows.using(inbox_settings.database)
        .filter(status=Status.DEAD)
        .update(
            status=Status.PENDING,
            attempts=0,
            next_attempt_at=now,
            locked_until=None,
            lease_id="",
            updated_at=now,
        )
    )


@dataclass
class OutboxStats:
    """The outbox's state: what the relays have still to send, and what they gave up on."""

    pending: int = 0
    dead: int = 0
    sent: int = 0
    #: Seconds the oldest pending row has waited since it was written (the relay's lag).
    oldest_pending_age: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)


def collect(now: datetime | None = None) -> OutboxStats:
    """Counts by status and the oldest pending row's age: one ``GROUP BY``."""
    now = now or timezone.now()
    found = (
        OutboxMessage.objects.using(inbox_settings.database)
        .order_by()
        .values("status")
        .annotate(n=Count("pk"), oldest=Min("created_at"))
    )
    stats = OutboxStats()
    for row in found:
        stats.counts[row["status"]] = row["n"]
        if row["status"] == Status.PENDING and row["oldest"] is not None:
            stats.oldest_pending_age = max((now - row["oldest"]).total_seconds(), 0.0)
    stats.pending = stats.counts.get(Status.PENDING, 0)
    stats.dead = stats.counts.get(Status.DEAD, 0)
    stats.sent = stats.counts.get(Status.SENT, 0)
    return stats


def purge(*, older_than: float | None = None, batch_size: int = 1000) -> int:
    """Delete ``sent`` rows sent more than ``older_than`` seconds ago (default
    ``INBOX_OUTBOX_RETENTION``), ``batch_size`` per statement. Returns how many."""
    using = inbox_settings.database
    retention = outbox_settings.retention if older_than is None else older_than
    cutoff = timezone.now() - timedelta(seconds=retention)
    deleted = 0
    while True:
        batch = list(
            OutboxMessage.objects.using(using)
            .filter(status=Status.SENT, sent_at__lt=cutoff)
            .order_by("sent_at")
            .values_list("pk", flat=True)[:batch_size]
        )
        if not batch:
            return deleted
        count, _ = (
            OutboxMessage.objects.using(using).filter(pk__in=batch, status=Status.SENT).delete()
        )
        deleted += count
