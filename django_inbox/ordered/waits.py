"""When an ordered consumer's ``waiting`` version is looked at again.

A version waits either behind a predecessor that exists (its sequence minus one, in a status
that can still run: it runs, is skipped, fails or is set aside, and an operator resolves it) or
behind a gap (no such row). Only a gap needs the sweep
(:func:`django_inbox.ordered.gaps.park_expired_gaps`): such a row gets its gap deadline in
``next_attempt_at``. A row behind an existing predecessor has none and costs nothing until its
predecessor is applied and releases it (or, if that predecessor is deleted, until
:func:`django_inbox.ordered.gaps.rearm_orphans` gives it a deadline again).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Q, QuerySet

from .. import clock
from ..conf import inbox_settings
from ..models import InboxMessage

Status = InboxMessage.Status

#: Statuses of a version that can still run (a predecessor worth waiting for).
RUNNABLE = (
    Status.RECEIVED,
    Status.IN_PROGRESS,
    Status.FAILED,
    Status.DEAD,
    Status.PARKED,
    Status.WAITING,
)


def versions_that_can_run(
    consumer: str, key: str, using: str, *, through: int | None = None
) -> QuerySet[InboxMessage]:
    """``key``'s versions that can still run. While a re-run is under way up to ``through``,
    a version up to there counts only if the re-run sends it: any other is a stale copy."""
    rows = InboxMessage.objects.using(using).filter(consumer=consumer, key=key, status__in=RUNNABLE)
    if through is not None:
        rows = rows.filter(Q(rerun=True) | Q(sequence__gt=through))
    return rows


def predecessor_exists(
    consumer: str, key: str, sequence: int, using: str, *, through: int | None = None
) -> bool:
    """Whether a version ``sequence`` of ``key`` exists that can still run (a completed or
    skipped one can't: the key applied it); ``through`` as for :func:`versions_that_can_run`."""
    return (
        versions_that_can_run(consumer, key, using, through=through)
        .filter(sequence=sequence)
        .exists()
    )


def gap_deadline(consumer: str, now: datetime) -> datetime:
    return now + timedelta(seconds=inbox_settings.policy(consumer).gap_timeout)


#: Seconds between two looks at a re-run version that follows a sequence no version holds (it
#: goes on past it as soon as its key reaches it, not a ``gap_timeout`` later).
HOLE_LOOK = 1.0


def deadline(
    consumer: str,
    key: str,
    sequence: int,
    now: datetime,
    using: str,
    *,
    rerun: bool = False,
    through: int | None = None,
) -> datetime | None:
    """``next_attempt_at`` of version ``sequence`` of ``key`` going ``waiting`` now (under the
    key's lock): ``None`` behind an existing predecessor, or right behind a re-run under way
    up to ``through`` (its end releases it); else its gap deadline (for a re-run's version,
    the next look at the hole it follows)."""
    if through is not None and not rerun and sequence == through + 1:
        return None
    if predecessor_exists(consumer, key, sequence - 1, using, through=through):
        return None
    if rerun:
        return now + timedelta(seconds=HOLE_LOOK)
    return gap_deadline(consumer, now)


def release_unordered(consumer: str, using: str) -> int:
    """``waiting`` rows of ``consumer`` when it is no longer ordered: nothing would release
    them, so they are due now (those an operator skipped are ``skipped``). One probe of the
    waiting rows' index when there are none. Returns how many changed."""

    rows = InboxMessage.objects.using(using).filter(consumer=consumer, status=Status.WAITING)
    if not rows.exists():
        return 0
    now = clock.now()
    note = "released: the consumer is no longer ordered"
    skipped = rows.filter(skip_requested=True).update(
        status=Status.SKIPPED,
        next_attempt_at=None,
        processed_at=now,
        updated_at=now,
        last_error=f"skipped by an operator; {note}",
    )
    due = rows.update(status=Status.RECEIVED, next_attempt_at=now, updated_at=now, last_error=note)
    return skipped + due
