"""Rows whose worker died or hung: who is to blame, and how they are taken over.

A worker that dies leaves its claimed rows ``in_progress`` until their lease expires. Then the
next claim takes them over (:func:`take_over`), or ``inbox_reclaim`` gives them back
(:func:`django_inbox.services.reclaim`). Both apply one blame rule, :func:`split_blame`, to a
dead worker's whole batch at once (:func:`whole_leases`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from .. import events, history
from ..models import InboxMessage
from ..registry import registry
from ..wording import counted
from . import leases
from .retry import RetryPolicy

Status = InboxMessage.Status


def split_blame(
    abandoned: list[InboxMessage], running: dict[str, int]
) -> tuple[list[InboxMessage], list[InboxMessage]]:
    """Split rows of expired leases into those whose attempt counts and those never started.

    A worker runs its batch in primary-key order, and every row it finishes leaves
    ``in_progress``. So of the rows still holding a dead worker's lease, only the lowest pk
    was running when it died: that attempt counts. The others never started, so one poison
    message cannot use up its batch-mates' attempts. ``running`` maps each lease to that
    lowest pk, as :func:`whole_leases` read it with the rows it holds (read again later, a
    running row that committed meanwhile would make a row that never started look like it).

    A batch run in one shared transaction committed nothing, so none of its rows is blamed;
    the next claim runs them one transaction each, which finds the culprit if it strikes again.
    """
    blamed: list[InboxMessage] = []
    innocent: list[InboxMessage] = []
    for row in abandoned:
        if leases.is_shared(row.lease_id) or running.get(row.lease_id) != row.pk:
            innocent.append(row)
        else:
            blamed.append(row)
    return blamed, innocent


def whole_leases(
    batch: list[InboxMessage], stale: Any, using: str
) -> tuple[list[InboxMessage], set[int], dict[str, int]]:
    """Extend locked rows to whole dead-worker batches (leases); return them, every pk seen,
    and each lease's lowest ``in_progress`` pk (the row that was running, for
    :func:`split_blame`).

    :func:`split_blame` blames the lowest row still holding a lease. Once that row is
    decided, the lowest of the rest would be blamed next, so all rows of a lease must be
    decided in one transaction. Leases with a row locked by another process (a claim or a
    concurrent reclaim) are left whole for a later run, except when that row is the lease's
    lowest: it may be running still (an ordered consumer's version holds its row locked from
    before its handler to its commit), and deciding the rows above it leaves it the lowest,
    so its batch-mates, which never started, are given back without waiting for it.
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
    lowest: dict[str, int] = {}
    for pk, lease in members.items():
        lowest[lease] = min(pk, lowest.get(lease, pk))
    partial = {lease for pk, lease in members.items() if pk not in held and pk != lowest[lease]}
    whole = [row for row in batch if row.lease_id not in partial]
    return whole, {*members, *held}, lowest


def take_over(abandoned: list[InboxMessage], now: datetime, using: str) -> set[int]:
    """Prepare rows whose lease expired for a new claim; return the pks not to claim.

    Only the row that was running when its worker died has its attempt counted; it is claimed
    again at once unless that used up its attempts. Its batch-mates lose the attempt their dead
    claim counted. A dead worker's batch is decided whole, in the claim's transaction: rows of
    it beyond the claim's limit are locked too and given back (the blamed one as ``failed``
    after its backoff, the others due now), so a later claim cannot blame a second row of it.
    A batch partly locked by another process is left alone for a later claim (unless only its
    running row is locked: see :func:`whole_leases`).
    """
    stale = InboxMessage.objects.using(using).stale(now)
    whole, _, running = whole_leases(abandoned, stale, using)
    claiming = {row.pk for row in abandoned}
    dropped = claiming - {row.pk for row in whole}
    blamed, innocent = split_blame(whole, running)
    for row in innocent:
        if row.pk in claiming:
            leases.uncount(row, using)
        else:
            leases.release(row, now, using)
    for row in blamed:
        status = record_abandoned_attempt(row, now, using, retry_now=row.pk in claiming)
        if status == Status.DEAD:
            dropped.add(row.pk)
    return dropped


def policy_of(row: InboxMessage) -> RetryPolicy:
    return RetryPolicy.for_handler(row.consumer, registry.get(row.consumer, row.event_type))


def abandoned_status(row: InboxMessage) -> str:
    """What recording a dead worker's attempt on ``row`` makes it (``failed`` or ``dead``)."""
    return Status.DEAD if policy_of(row).used_up(row.attempts) else Status.FAILED


def record_abandoned_attempt(
    row: InboxMessage, now: datetime, using: str, *, retry_now: bool
) -> str:
    """Record that the worker running ``row`` died or hung; return the row's new status.

    The row becomes ``dead`` once its attempts are used up. Otherwise, with ``retry_now`` it
    stays ``in_progress`` for the claim that is taking it over; without, it becomes ``failed``
    and due after the policy's backoff, as if its handler had raised.
    """
    dead = abandoned_status(row) == Status.DEAD
    retry_at: datetime | None = None
    if not dead:
        retry_at = now if retry_now else now + timedelta(seconds=policy_of(row).delay(row.attempts))
    entry = history.error_entry(
        None,
        attempt=row.attempts,
        at=now,
        outcome=Status.DEAD if dead else Status.FAILED,
        error_type="LeaseExpired",
        retry_at=retry_at,
        message=(
            f"attempt {row.attempts} did not finish within its lease: the worker died or hung"
            + (f"; giving up after {counted(row.attempts, 'attempt')}" if dead else "")
        ),
    )
    status = Status.DEAD if dead else Status.IN_PROGRESS if retry_now else Status.FAILED
    if not leases.abandoned(row, entry, status, retry_at, now, using):
        return status  # someone else took the row over first: nothing happened here
    events.event(
        "reclaimed",
        **events.about(row, using),
        error_type="LeaseExpired",
        retry_at=retry_at,
        outcome=str(status),
        detail="the worker died or hung (lease expired)",
    )
    if dead:
        events.event(
            "dead",
            **events.about(row, using),
            error_type="LeaseExpired",
            detail=f"its worker died or hung in each attempt ({counted(row.attempts, 'attempt')})",
        )
    return status
