"""``reclaim()`` behind ``inbox_reclaim``: rows whose worker died, given back now.

Workers take over rows of dead workers on their own, once their lease expires (see
:mod:`django_inbox.processing.takeover`). Reclaiming does the same for rows no worker will look
at soon (a consumer whose workers are all gone), and for operators who want them accounted for
now. It clears the lease, so a worker that wakes up later (a ``SIGSTOP``-ped process, a long GC
pause) finds its fenced completion matching nothing and rolls its work back. A row whose
worker's open transaction holds it locked (an ordered consumer's version, completed before its
handler) is not reclaimed: that worker is still running it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from .. import clock
from ..conf import inbox_settings
from ..models import InboxMessage
from ..ordered import gaps
from ..processing import leases
from ..processing.takeover import (
    abandoned_status,
    record_abandoned_attempt,
    split_blame,
    whole_leases,
)

Status = InboxMessage.Status


@dataclass
class ReclaimResult:
    """What :func:`reclaim` did (or, with ``dry_run``, would do)."""

    #: Rows whose attempt was counted and that will be retried after their backoff.
    failed: int = 0
    #: Rows whose attempt was counted and that used up their attempts.
    dead: int = 0
    #: Batch-mates of a running row that never started: back to due, attempt not counted.
    released: int = 0
    #: Ordered consumers' ``waiting`` rows parked because their gap outlived ``gap_timeout``.
    parked_gaps: int = 0
    #: With ``dry_run``: ``waiting`` rows past their gap deadline, which a real run looks at
    #: (and parks, if their gap is still open).
    expired_gaps: int = 0
    #: Ordered consumers' ``waiting`` rows whose predecessor was deleted (nothing would
    #: release them): given a gap deadline, due now.
    rearmed: int = 0
    #: ``(consumer, message_id, new status)`` of every row, in the order handled.
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.failed + self.dead + self.released


def reclaimable(
    *, consumer: str | None = None, older_than: float = 0.0, now: datetime | None = None
) -> Any:
    """``in_progress`` rows whose lease expired and that were claimed ``older_than`` ago."""
    now = now or clock.now()
    rows = InboxMessage.objects.using(inbox_settings.database).for_consumer(consumer)
    return rows.stale(now).filter(updated_at__lte=now - timedelta(seconds=older_than))


def reclaim(
    *,
    consumer: str | None = None,
    older_than: float = 0.0,
    dry_run: bool = False,
    batch_size: int = 500,
) -> ReclaimResult:
    """Give back ``in_progress`` rows whose worker died: ``failed`` (attempt counted) or ``dead``.

    Only rows whose lease has expired are touched, never one a live worker still holds.
    ``older_than`` (seconds) adds a margin: rows claimed less than that long ago are left.
    A row of a dead worker's batch that never started goes back to due with its attempt
    uncounted (see :func:`~django_inbox.processing.takeover.split_blame`). Rows another process is
    claiming or reclaiming at the same moment are skipped, never waited for; so is the rest of
    their dead worker's batch, which is always decided whole, in one transaction
    (``batch_size`` may be exceeded to hold it), unless the row held elsewhere is the batch's
    running one: the rows above it are decided without it
    (:func:`~django_inbox.processing.takeover.whole_leases`).
    """
    using = inbox_settings.database
    clock.refresh(using)  # leases expire on the database's clock
    result = ReclaimResult()
    if dry_run:
        result.expired_gaps = gaps.expired_waiting(using, consumer=consumer).count()
    else:
        result.rearmed = gaps.rearm_orphans(using, consumer=consumer)
        result.parked_gaps = gaps.park_expired_gaps(using, consumer=consumer)
    seen: set[int] = set()
    while True:
        now = clock.now()
        with transaction.atomic(using=using):
            stale = reclaimable(consumer=consumer, older_than=older_than, now=now)
            batch = list(
                stale.exclude(pk__in=seen)
                .order_by("pk")
                .select_for_update(skip_locked=True)[:batch_size]
            )
            if not batch:
                return result
            batch, looked_at, running = whole_leases(batch, stale, using)
            seen.update(looked_at)
            blamed, innocent = split_blame(batch, running)
            for row in blamed:
                status: str
                if dry_run:
                    status = abandoned_status(row)
                else:
                    status = record_abandoned_attempt(row, now, using, retry_now=False)
                result.rows.append((row.consumer, row.message_id, status))
                if status == Status.DEAD:
                    result.dead += 1
                else:
                    result.failed += 1
            for row in innocent:
                status = Status.RECEIVED if row.attempts <= 1 else Status.FAILED
                if not dry_run:
                    leases.release(row, now, using)
                result.rows.append((row.consumer, row.message_id, status))
                result.released += 1
