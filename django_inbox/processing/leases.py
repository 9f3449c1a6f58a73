"""Leases: how a claimed row is held, and every state change fenced on the lease.

A claim gives its rows a lease: a ``lease_id`` and an expiry (``locked_until``; for an
``in_progress`` row ``next_attempt_at`` holds the same time, so that the one polled index finds
new, due and abandoned rows alike). Every later change of a claimed row goes through
:func:`fenced`: ``UPDATE … WHERE id = … AND lease_id = <ours>``. A worker whose lease was taken
over (it hung past the expiry, or was reclaimed) matches nothing, so it can neither complete
nor fail nor release a row that has moved on.

Only a claim sets a lease id, always with ``in_progress``, and every change that leaves
``in_progress`` clears it (:func:`_cleared`; operators' actions never take an ``in_progress``
row). So the lease alone says the row is still ``in_progress`` and ours, and the fence does not
name the status: a ``status`` condition lets PostgreSQL answer it from the polled rows' partial
index, which with statistics from before a backlog it does, reading that whole index for every
completion instead of one primary-key entry.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from django.db.models import Case, F, QuerySet, Value, When
from django.db.models.functions import Greatest

from .. import clock, history
from ..db import statements
from ..db.statements.common import fence
from ..models import InboxMessage

Status = InboxMessage.Status

#: Marks the lease of a batch whose handlers run in one transaction (``commit_every``).
SHARED_TRANSACTION = "b:"


def new_lease_id(*, shared: bool = False) -> str:
    return (SHARED_TRANSACTION if shared else "") + uuid.uuid4().hex


def is_shared(lease_id: str) -> bool:
    return lease_id.startswith(SHARED_TRANSACTION)


def solo(lease_id: str) -> str:
    """The lease for running the same rows one transaction each."""
    return lease_id.removeprefix(SHARED_TRANSACTION)


def fenced(row: InboxMessage, using: str) -> QuerySet[InboxMessage]:
    """``row`` for as long as its lease holds it: the fence every change of a claimed row uses."""
    return InboxMessage.objects.using(using).filter(pk=row.pk, lease_id=fence(row.lease_id))


#: The attempt a claim counted, taken back: never below 0 (a row written by hand may hold 0).
#: Raised to 1 before the subtraction: MySQL and MariaDB compute ``attempts - 1`` in the
#: column's unsigned type, where ``0 - 1`` is an error rather than -1.
UNCOUNTED = Greatest(F("attempts"), Value(1)) - 1


def _cleared(now: datetime) -> dict[str, Any]:
    """What leaving ``in_progress`` clears: the lease and its expiry."""
    return {"locked_until": None, "lease_id": "", "updated_at": now}


def _given_back(row: InboxMessage, now: datetime) -> dict[str, Any]:
    """A row back to due now with the attempt its claim counted taken back."""
    return {
        **_cleared(now),
        "status": Status.RECEIVED if row.attempts <= 1 else Status.FAILED,
        "attempts": UNCOUNTED,
        "next_attempt_at": now,
    }


def complete(row: InboxMessage, now: datetime, using: str) -> bool:
    """``completed``, in the caller's transaction (with the handler's writes)."""
    return statements.complete(row.pk, row.lease_id, now, using)


def complete_all(rows: list[InboxMessage], using: str) -> int:
    """Complete claimed rows of one lease with one ``UPDATE``; return how many it held."""
    now = clock.now()
    return (
        InboxMessage.objects.using(using)
        .filter(pk__in=[row.pk for row in rows], lease_id=fence(rows[0].lease_id))
        .update(
            **_cleared(now),
            status=Status.COMPLETED,
            processed_at=now,
            next_attempt_at=None,
            last_error="",
        )
    )


def fail(
    row: InboxMessage,
    status: str,
    entry: dict[str, Any],
    next_attempt_at: datetime | None,
    now: datetime,
    using: str,
) -> bool:
    """A failed attempt: ``status`` (failed, dead or parked) with ``entry`` in the history."""
    return bool(
        fenced(row, using).update(
            **_cleared(now),
            status=status,
            last_error=history.summary(entry),
            history=history.append(row.history, entry),
            next_attempt_at=next_attempt_at,
        )
    )


def release(row: InboxMessage, now: datetime, using: str, *, due: datetime | None = None) -> int:
    """Give back a claimed row that never started: due now (or at ``due``), its attempt
    uncounted."""
    changes = _given_back(row, now)
    if due is not None:
        changes["next_attempt_at"] = due
    return fenced(row, using).update(**changes)


def set_aside(
    row: InboxMessage, status: str, changes: dict[str, Any], now: datetime, using: str
) -> bool:
    """A claimed row an ordered consumer does not run now (``skipped``, ``waiting``): its
    lease cleared and its claim's attempt taken back."""
    return bool(
        fenced(row, using).update(**_cleared(now), status=status, attempts=UNCOUNTED, **changes)
    )


def release_interrupted(row: InboxMessage, entry: dict[str, Any], using: str) -> int:
    """Give back the row whose attempt a lost connection cut short, ``entry`` saying so."""
    now = clock.now()
    return fenced(row, using).update(
        **_given_back(row, now), history=history.append(row.history, entry)
    )


def release_lease(lease_id: str, now: datetime, using: str) -> int:
    """Give back every row a claim committed under ``lease_id`` (its reply was lost)."""
    return (
        InboxMessage.objects.using(using)
        .filter(lease_id=lease_id, status=Status.IN_PROGRESS)
        .update(
            **_cleared(now),
            status=Case(
                When(attempts__lte=1, then=Value(Status.RECEIVED)), default=Value(Status.FAILED)
            ),
            attempts=UNCOUNTED,
            next_attempt_at=now,
        )
    )


def uncount(row: InboxMessage, using: str) -> None:
    """Take back the attempt a dead worker's claim counted, the row staying claimed."""
    InboxMessage.objects.using(using).filter(pk=row.pk).update(attempts=UNCOUNTED)


def abandoned(
    row: InboxMessage,
    entry: dict[str, Any],
    status: str,
    retry_at: datetime | None,
    now: datetime,
    using: str,
) -> bool:
    """Record that the worker holding ``row`` died: ``status`` ``in_progress`` keeps the lease
    for the claim taking it over; ``failed`` or ``dead`` clear it."""
    changes: dict[str, Any] = {
        "history": history.append(row.history, entry),
        "last_error": history.summary(entry),
        "updated_at": now,
    }
    if status != Status.IN_PROGRESS:
        changes.update(_cleared(now), status=status, next_attempt_at=retry_at)
    return bool(fenced(row, using).update(**changes))
