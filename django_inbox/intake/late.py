"""Late copies: a message that arrives again after ``inbox_purge`` deleted its completed row.

While the pair's tombstone is kept (``INBOX_TOMBSTONE_RETENTION`` after the purge) the copy's
insert goes in ``parked`` instead of running (:mod:`django_inbox.db.tombstones` says how each
database decides). Here the inbox writes why, in the insert's transaction, and reports it once
that committed: the ``parked`` event, ``message_parked`` signal and metrics, as for a handler's
``Park``. An operator who replays the row runs it once more, knowingly.
"""

from __future__ import annotations

import json
from typing import Any

from .. import clock, history
from ..db import tombstones
from ..db.statements import NewRow
from ..models import InboxMessage
from ..outcomes import Outcome

Status = InboxMessage.Status

#: The error type of a late copy's history entry.
LATE_COPY = "LateCopy"


def is_late(row: NewRow, intended: str) -> bool:
    """Whether ``row``, inserted as ``intended``, went in ``parked`` as a late copy."""
    return row.status == Status.PARKED and intended != Status.PARKED


def record(row: NewRow, pk: int, using: str) -> None:
    """Park the late copy ``pk`` with its reason, in the insert's transaction (on PostgreSQL the
    trigger parked it already; the update writes the reason)."""
    now = clock.now()
    found = tombstones.find(row.consumer, row.message_id, using)
    reason = (
        found.reason()
        if found is not None
        else "a copy of a purged message (its tombstone expired since): parked, not run again"
    )
    entry = history.error_entry(
        None, attempt=0, at=now, outcome=Status.PARKED, error_type=LATE_COPY, message=reason
    )
    row.attempts, row.processed_at, row.next_attempt_at = 0, None, None
    row.last_error = history.summary(entry)
    row.history = json.dumps([entry])
    InboxMessage.objects.using(using).filter(
        pk=pk, status__in=(*tombstones.RUNNING_STATUSES, Status.PARKED)
    ).update(
        status=Status.PARKED,
        attempts=0,
        next_attempt_at=None,
        locked_until=None,
        lease_id="",
        processed_at=None,
        last_error=row.last_error,
        history=[entry],
        updated_at=now,
    )


def report(row: NewRow, pk: int, using: str) -> Outcome:
    """Report a late copy that committed ``parked``; return :attr:`Outcome.PARKED`."""
    from ..processing.attempts import failure
    from .rows import materialise

    entries: list[dict[str, Any]] = json.loads(row.history)
    message = materialise(row, pk, using)
    failure(message, entries[-1], Status.PARKED, None, using=using)
    return Outcome.PARKED
