"""When an ordered consumer's ``waiting`` version is looked at again.

A version waits either behind a predecessor that exists (its sequence minus one, in a status
that can still run: it runs, is skipped, fails or is set aside, and an operator resolves it) or
behind a gap (no such row). Only a gap needs the sweep
(:func:`django_inbox.gaps.park_expired_gaps`): such a row gets its gap deadline in
``next_attempt_at``. A row behind an existing predecessor has none and costs nothing until its
predecessor is applied and releases it (or, if that predecessor is deleted, until
:func:`django_inbox.gaps.rearm_orphans` gives it a deadline again).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from .conf import inbox_settings
from .models import InboxMessage

Status = InboxMessage.Status

#: Statuses of a version that can still run (a predecessor worth waiting for).
RUNNABLE = (
    Status.RECEIVED, Status.IN_PROGRESS, Status.FAILED, Status.DEAD, Status.PARKED,
    Status.WAITING,
)  # fmt: skip


def predecessor_exists(consumer: str, key: str, sequence: int, using: str) -> bool:
    """Whether a version ``sequence`` of ``key`` exists that can still run (a completed or
    skipped one can't: the key applied it, or a re-run runs it again as a new row state)."""
    return (
        InboxMessage.objects.using(using)
        .filter(consumer=consumer, key=key, sequence=sequence, status__in=RUNNABLE)
        .exists()
    )


def gap_deadline(consumer: str, now: datetime) -> datetime:
    return now + timedelta(seconds=inbox_settings.policy(consumer).gap_timeout)


#: Seconds between two looks at a re-run version that follows a sequence no version holds (it
#: goes on past it as soon as its key reaches it, not a ``gap_timeout`` later).
HOLE_LOOK = 1.0


def deadline(
    consumer: str, key: str, sequence: int, now: datetime, using: str, *, rerun: bool = False
) -> datetime | None:
    """``next_attempt_at`` of version ``sequence`` of ``key`` going ``waiting`` now (under the
    key's lock): ``None`` behind an existing predecessor, else its gap deadline (for a re-run's
    version, the next look at the hole it follows)."""
    if predecessor_exists(consumer, key, sequence - 1, using):
        return None
    if rerun:
        return now + timedelta(seconds=HOLE_LOOK)
    return gap_deadline(consumer, now)
