"""Rows whose worker died: who is to blame, and ``reclaim()`` behind ``inbox_reclaim``.

A claim gives its rows a lease (``lease_id``, ``locked_until``). A worker that dies or hangs
leaves them ``in_progress`` after the lease expires. Workers take such rows over on their own
(see :func:`django_inbox.processing.claim_batch`); :func:`reclaim` does the same for rows no
worker will look at soon (a consumer whose workers are all gone) and for operators who want
them accounted for now. Both apply one blame rule, :func:`split_blame`.

Reclaiming clears the lease, so a worker that wakes up later (a ``SIGSTOP``-ped process, a
long GC pause) finds its fenced completion matching nothing and rolls its work back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Min
from django.utils import timezone

from . import history, observe
from .conf import inbox_settings
from .models import InboxMessage
from .registry import registry
from .retry import RetryPolicy

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status

#: Marks the lease of a batch whose handlers run in one transaction.
SHARED_TRANSACTION = "b:"


def split_blame(
    abandoned: list[InboxMessage], using: str
) -> tuple[list[InboxMessage], list[InboxMessage]]:
    """Split rows of expired leases into those whose attempt counts and those never started.

    A worker runs its batch in primary-key order, and every row it finishes leaves
    ``in_progress``. So of the rows still holding a dead worker's lease, only the lowest pk
    was running when it died: that attempt counts. The others never started, so one poison
    message cannot use up its batch-mates' attempts.

    A batch run in one shared transaction committed nothing, so none of its rows is blamed;
    the next claim runs them one transaction each, which finds the culprit if it strikes again.
    """
    leases = {row.lease_id for row in abandoned}
    running = dict(
        InboxMessage.objects.using(using)
        .filter(status=Status.IN_PROGRESS, lease_id__in=leases)
        .values("lease_id")
        .annotate(first=Min("pk"))
        .values_list("lease_id", "first")
    )
    blamed: list[InboxMessage] = []
    innocent: list[InboxMessage] = []
    for row in abandoned:
        shared = row.lease_id.startswith(SHARED_TRANSACTION)
        if shared or running.get(row.lease_id) != row.pk:
            innocent.append(row)
        else:
            blamed.append(row)
    return blamed, innocent


def record_abandoned_attempt(
    row: InboxMessage, now: datetime, using: str, *, retry_now: bool
) -> str:
    """Record that the worker running ``row`` died or hung; return the row's new status.

    The row becomes ``dead`` once its attempts are used up. Otherwise, with ``retry_now`` it
    stays ``in_progress`` for the claim that is taking it over; without, it becomes ``failed``
    and due after the policy's backoff, as if its handler had raised.
    """
    policy = _policy(row)
    dead = row.attempts >= policy.max_attempts
    retry_at = None if dead else now if retry_now else now + _seconds(policy.delay(row.attempts))
    entry = history.error_entry(
        None,
        attempt=row.attempts,
        at=now,
        outcome=Status.DEAD if dead else Status.FAILED,
        error_type="LeaseExpired",
        retry_at=retry_at,
        message=(
            f"attempt {row.attempts} did not finish within its lease: the worker died or hung"
            + (f"; giving up after {row.attempts} attempts" if dead else "")
        ),
    )
    changes: dict[str, Any] = {
        "history": history.append(row.history, entry),
        "last_error": history.summary(entry),
        "updated_at": now,
    }
    if dead or not retry_now:
        status = Status.DEAD if dead else Status.FAILED
        changes.update(status=status, next_attempt_at=retry_at, locked_until=None, lease_id="")
    else:
        status = Status.IN_PROGRESS
    updated = (
        InboxMessage.objects.using(using)
        .filter(pk=row.pk, lease_id=row.lease_id, status=Status.IN_PROGRESS)
        .update(**changes)
    )
    if not updated:  # someone else took the row over first: nothing happened here
        return status
    observe.event(
        "reclaimed",
        consumer=row.consumer,
        message_id=row.message_id,
        event_type=row.event_type,
        pk=row.pk,
        attempt=row.attempts,
        using=using,
        error_type="LeaseExpired",
        retry_at=retry_at,
        outcome=str(status),
        detail="the worker died or hung (lease expired)",
    )
    if dead:
        observe.event(
            "dead",
            consumer=row.consumer,
            message_id=row.message_id,
            event_type=row.event_type,
            pk=row.pk,
            attempt=row.attempts,
            using=using,
            error_type="LeaseExpired",
            detail=f"its worker died or hung in each of {row.attempts} attempts",
        )
    return status


def _policy(row: InboxMessage) -> RetryPolicy:
    return RetryPolicy.for_handler(row.consumer, registry.get(row.consumer, row.event_type))


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


@dataclass
class ReclaimResult:
    """What :func:`reclaim` did (or, with ``dry_run``, would do)."""

    #: Rows whose attempt was counted and that will be retried after their backoff.
    failed: int = 0
    #: Rows whose attempt was counted and that used up their attempts.
    dead: int = 0
    #: Batch-mates of a running row that never started: back to due, attempt not counted.
    released: int = 0
    #: ``(consumer, message_id, new status)`` of every row, in the order handled.
    rows: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.failed + self.dead + self.released


def reclaimable(
    *, consumer: str | None = None, older_than: float = 0.0, now: datetime | None = None
) -> Any:
    """``in_progress`` rows whose lease expired and that were claimed ``older_than`` ago."""
    now = now or timezone.now()
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
    uncounted (see :func:`split_blame`). Rows another process is claiming or reclaiming
    at the same moment are skipped, never waited for; so is the rest of their dead
    worker's batch, which is always decided whole, in one transaction (``batch_size`` may
    be exceeded to hold it).
    """
    using = inbox_settings.database
    result = ReclaimResult()
    seen: set[int] = set()
    while True:
        now = timezone.now()
        with transaction.atomic(using=using):
            stale = reclaimable(consumer=consumer, older_than=older_than, now=now)
            batch = list(
                stale.exclude(pk__in=seen)
                .order_by("pk")
                .select_for_update(skip_locked=True)[:batch_size]
            )
            if not batch:
                return result
            batch, looked_at = whole_leases(batch, stale, using)
            seen.update(looked_at)
            blamed, innocent = split_blame(batch, using)
            for row in blamed:
                status: str
                if dry_run:
                    dead = row.attempts >= _policy(row).max_attempts
                    status = Status.DEAD if dead else Status.FAILED
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
                    release_unstarted(row, now, using)
                result.rows.append((row.consumer, row.message_id, status))
                result.released += 1


def whole_leases(
    batch: list[InboxMessage], stale: Any, using: str
) -> tuple[list[InboxMessage], set[int]]:
    """Extend locked rows to whole dead-worker batches (leases); return them and every pk seen.

    :func:`split_blame` blames the lowest row still holding a lease. Once that row is
    reclaimed, the lowest of the rest would be blamed next, so all rows of a lease must be
    decided in one transaction. Leases whose rows are partly locked by another process
    (a claim or a concurrent reclaim) are left whole for a later run.
    """
    members = dict(
        InboxMessage.objects.using(using)
        .filter(status=Status.IN_PROGRESS, lease_id__in={row.lease_id for row in batch})
        .values_list("pk", "lease_id")
    )
    held = {row.pk for row in batch}
    missing = [pk for pk in members if pk not in held]
    if missing:
        # Rows locked by others are skipped; so are rows whose lease changed meanwhile.
        extra = list(
            stale.filter(pk__in=missing, lease_id__in=set(members.values()))
            .order_by("pk")
            .select_for_update(skip_locked=True)
        )
        batch = sorted([*batch, *extra], key=lambda row: row.pk)
        held.update(row.pk for row in extra)
    partial = {lease for pk, lease in members.items() if pk not in held}
    whole = [row for row in batch if row.lease_id not in partial]
    return whole, {*members, *held}


def release_unstarted(row: InboxMessage, now: datetime, using: str) -> int:
    """Give back a claimed row that never started, its attempt uncounted, due now."""
    return (
        InboxMessage.objects.using(using)
        .filter(pk=row.pk, lease_id=row.lease_id, status=Status.IN_PROGRESS)
        .update(
            status=Status.RECEIVED if row.attempts <= 1 else Status.FAILED,
            attempts=F("attempts") - 1,
            next_attempt_at=now,
            locked_until=None,
            lease_id="",
            updated_at=now,
        )
    )
