"""``deliver()``: one message stored and processed inline (several at once:
:mod:`django_inbox.intake.batches`).

A new message's row is inserted already ``completed``, in the handler's own transaction: one
statement more than the bare handler, and a duplicate costs no handler run. What cannot be
done in that one transaction (a failure, a redelivery the inbox has no record of, a row that
already exists) goes through the claimed path of :mod:`django_inbox.processing.claims` and
:mod:`django_inbox.processing.attempts`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .. import clock, events, history, reporting
from ..conf import inbox_settings
from ..db import statements
from ..db.connection import connection_lost
from ..models import InboxMessage
from ..ordered import holding, ordering
from ..outcomes import Outcome
from ..processing import interruptions
from ..processing.attempts import (
    attempt_one,
    failure,
    failure_outcome,
    processed,
    run_released,
)
from ..processing.calling import run_handler
from ..processing.claims import claim_batch
from ..processing.commits import committing
from ..processing.giving_back import give_back_interrupted
from ..processing.retry import RetryPolicy
from ..registry import Handler, registry
from . import late
from .rows import (
    NewRow,
    fresh,
    insert,
    insert_or_status,
    materialise,
    once_more_if_index_changed,
    prepare,
)
from .storing import unhandled

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status

_STATUS_OUTCOMES = {
    Status.COMPLETED: Outcome.DUPLICATE,
    Status.DEAD: Outcome.DEAD,
    Status.PARKED: Outcome.PARKED,
    Status.FAILED: Outcome.FAILED,
    Status.IN_PROGRESS: Outcome.IN_PROGRESS,
    Status.SKIPPED: Outcome.SKIPPED,
    Status.WAITING: Outcome.WAITING,
    # A ``received`` row we could not claim is being claimed by a worker right now.
    Status.RECEIVED: Outcome.IN_PROGRESS,
}

#: Consumers whose last delivery in this process was a duplicate. Duplicates come in runs (a
#: broker redelivering a backlog after a restart, a producer re-sending a batch): while one
#: lasts, a message is first looked up with one read-only query, no transaction, which is
#: all a duplicate then costs. The first new message ends the run (and paid one query more).
_duplicate_run: set[str] = set()
#: The most waiting versions one ``deliver()`` runs after the one it delivered released them;
#: a longer chain is left due for workers, so a broker's ack or a webhook's reply waits for
#: a bounded amount of work.
INLINE_RELEASED = 10
#: ``deliver_existing``'s ``status`` when the status is not known yet.
_UNKNOWN = "?"


def deliver(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
    sequence: int | None = None,
    redelivered: bool = False,
) -> Outcome:
    """Store one message and process it inline; return what happened as an :class:`Outcome`.

    Args:
        consumer: the consumer (service or projection) the message is for; deduplication is
            scoped to it.
        message_id: the producer's stable id of the message (at most 255 characters).
        event_type: selects the handler registered with ``@inbox_handler``.
        payload: the message body; anything JSON can hold.
        headers: broker or HTTP headers worth keeping (JSON mapping).
        source: where the message came from (queue, webhook sender, CloudEvents source).
        key: ordering or partition key.
        sequence: the key's version (an int from 1), for consumers with ``"ordered": True``:
            they run a key's messages one at a time in ascending sequence, skip stale ones
            and hold back those after a gap (see :mod:`django_inbox.ordered.ordering`).
        redelivered: the broker says it delivered this message before (AMQP ``redelivered``,
            a delivery count). If the inbox has no row for it, the earlier delivery died
            before committing, perhaps killed by this very message: that attempt is counted,
            and this one is counted durably before the handler runs, so a message that kills
            its consumer every time ends ``dead`` after ``max_attempts``.

    A new message's row, the handler's writes and the ``completed`` status commit in one
    transaction. A handler exception rolls the handler's writes back and records the failure
    in a transaction of its own; it is returned as ``FAILED``, ``DEAD`` or ``PARKED``, never
    raised. Bad input raises an :class:`~django_inbox.InvalidMessage` (a ``ValueError``) and
    stores nothing. Database errors of the inbox itself are raised: nothing was committed.
    """
    row = prepare(
        consumer=consumer,
        message_id=message_id,
        event_type=event_type,
        payload=payload,
        headers=headers,
        source=source,
        key=key,
        sequence=sequence,
    )
    using = inbox_settings.database
    if interruptions.pending():
        give_back_interrupted(using)
    return once_more_if_index_changed(  # each try from the message as it arrived
        using, lambda: deliver_row(fresh(row), using, redelivered=redelivered)
    )


def deliver_row(
    row: NewRow, using: str, *, again: bool = True, redelivered: bool = False
) -> Outcome:
    handler = registry.get(row.consumer, row.event_type)
    if handler is None:
        outcome = unhandled(row, using)
        return outcome if outcome is not None else deliver_existing(row, using, again=again)
    if redelivered or row.consumer in _duplicate_run:
        status = statements.current_status(row.consumer, row.message_id, using)
        if status is not None:
            # A redelivered message is never delivered as new, even if its row vanishes.
            again = again and not redelivered
            return deliver_existing(row, using, again=again, status=status)
        _duplicate_run.discard(row.consumer)
        if redelivered:
            return _deliver_redelivered(row, using)

    if row.key and ordering.applies(row.consumer, row.key):
        return _deliver_ordered(row, handler, using)
    now = clock.now()
    row.status, row.attempts, row.processed_at = Status.COMPLETED, 1, now
    pk: int | None = None
    message: InboxMessage | None = None
    started = time.perf_counter()
    try:
        with committing(using, lambda: [] if pk is None else [pk]):
            pk, status = insert_or_status(row, now, using)
            if pk is not None and row.status == Status.COMPLETED:
                message = materialise(row, pk, using)
                run_handler(handler, message, using)
    except Exception as exc:
        if pk is None or connection_lost(exc, using):
            # Nothing is stored (the inbox's own insert failed, or the database went away):
            # the caller (a broker consumer, a webhook sender) delivers it again.
            raise
        duration = time.perf_counter() - started
        return _record_first_failure(row, exc, handler, using, duration)
    if pk is not None and message is None:
        return late.report(row, pk, using)  # a late copy of a purged message: parked
    if message is None:
        return deliver_existing(row, using, again=again, status=status or _UNKNOWN)
    processed(message, time.perf_counter() - started, using)
    return Outcome.PROCESSED


def _deliver_ordered(row: NewRow, handler: Handler, using: str) -> Outcome:
    """A keyed message of an ordered consumer: under its key's lock, run it (the row goes in
    ``completed`` with the handler's writes and the key's new applied sequence), or store it
    ``skipped`` (stale) or ``waiting`` (a gap). Then run the versions it made due, each in
    its own transaction."""
    now = clock.now()
    pk: int | None = None
    status: str | None = None
    verdict: ordering.Verdict | None = None
    message: InboxMessage | None = None
    released: list[str] = []
    started = time.perf_counter()
    try:
        with committing(using, lambda: [pk] if pk is not None and message is not None else []):
            verdict, released = holding.place_new(row, now, using)
            intended = row.status
            pk, status = insert_or_status(row, now, using)
            if pk is not None and late.is_late(row, intended):
                verdict = None  # a late copy of a purged message: parked
            elif pk is not None and verdict is ordering.Verdict.RUN:
                message = materialise(row, pk, using)
                run_handler(handler, message, using)
                if row.sequence is not None:
                    released += ordering.advance(row.consumer, row.key, row.sequence, now, using)
    except Exception as exc:
        if pk is None or connection_lost(exc, using):
            raise
        duration = time.perf_counter() - started
        return _record_first_failure(fresh(row), exc, handler, using, duration)
    if pk is None:
        return deliver_existing(fresh(row), using, status=status or _UNKNOWN)
    if verdict is None:
        outcome = late.report(row, pk, using)
        run_released(row.consumer, released, using, limit=INLINE_RELEASED)
        return outcome
    if message is None:
        kind = Outcome.SKIPPED if verdict is ordering.Verdict.SKIP else Outcome.WAITING
        events.event(str(kind), **events.about(row, using, pk=pk, attempt=0))
        return kind
    processed(message, time.perf_counter() - started, using)
    run_released(row.consumer, released, using, limit=INLINE_RELEASED)
    return Outcome.PROCESSED


def _deliver_redelivered(row: NewRow, using: str) -> Outcome:
    """A redelivery the inbox has no record of: count the lost attempt, then run durably."""
    now = clock.now()
    entry = history.error_entry(
        None,
        attempt=1,
        at=now,
        outcome=Status.FAILED,
        error_type="LostAttempt",
        retry_at=now,
        message=(
            "the broker redelivered a message the inbox had no record of: an earlier "
            "delivery ended before committing (the process died or the connection dropped)"
        ),
    )
    row.status, row.attempts, row.next_attempt_at = Status.FAILED, 1, now
    row.last_error = history.summary(entry)
    row.history = json.dumps([entry])
    pk, status = insert_or_status(row, now, using)
    if pk is not None and row.status == Status.PARKED:
        return late.report(row, pk, using)  # a late copy of a purged message
    # A row that appeared since our look (or was purged again) is not new: never deliver a
    # redelivered message as a first delivery.
    known = Status.FAILED if pk is not None else status or _UNKNOWN
    return deliver_existing(row, using, again=False, status=known)


def _record_first_failure(
    row: NewRow, exc: Exception, handler: Handler, using: str, duration: float | None = None
) -> Outcome:
    """Store a new message whose first attempt failed (its own transaction)."""
    now = clock.now()
    policy = RetryPolicy.for_handler(row.consumer, handler)
    status, delay = failure_outcome(exc, 1, policy)
    row.next_attempt_at = None if delay is None else now + timedelta(seconds=delay)
    entry = history.error_entry(
        exc, attempt=1, at=now, outcome=status, retry_at=row.next_attempt_at
    )
    row.status, row.attempts, row.processed_at = status, 1, None
    row.last_error = history.summary(entry)
    row.history = json.dumps([entry])
    intended = row.status
    pk = insert(row, now, using)
    if pk is None:
        # A concurrent delivery stored it while ours rolled back; report that one's state.
        return deliver_existing(row, using, again=False)
    if late.is_late(row, intended):
        return late.report(row, pk, using)  # purged meanwhile: a late copy now
    message = materialise(row, pk, using)
    failure(message, entry, status, row.next_attempt_at, using=using, duration=duration)
    reporting.handler_failed(exc, message)
    return Outcome(status)


def deliver_existing(
    row: NewRow, using: str, *, again: bool = True, status: str | None = _UNKNOWN
) -> Outcome:
    """The message's row exists: report it, or process it if it is due and free. ``status``
    is the row's status if the caller has just read it."""
    if status == _UNKNOWN:
        status = statements.current_status(row.consumer, row.message_id, using)
    if status == Status.COMPLETED:
        _duplicate_run.add(row.consumer)
        events.event("duplicate", **events.about(row, using, attempt=0))
        return Outcome.DUPLICATE
    if status in (Status.RECEIVED, Status.FAILED, Status.IN_PROGRESS):
        claimed = claim_batch(row.consumer, 1, using=using, message_id=row.message_id)
        if claimed:
            attempted = attempt_one(claimed, using)
            run_released(row.consumer, list(attempted.released), using, limit=INLINE_RELEASED)
            return attempted.outcome
        status = statements.current_status(row.consumer, row.message_id, using)
    if status is None:
        # Purged between our insert and our look: it is new again (once; then report it busy).
        if not again:
            return Outcome.IN_PROGRESS
        return deliver_row(fresh(row), using, again=False)
    return _STATUS_OUTCOMES[Status(status)]
