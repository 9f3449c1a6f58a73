"""A worker's decision for a claimed version of an ordered consumer, in its transaction: run
it, skip it (stale, or an operator's skip), set it aside to wait, or give it back when another
transaction holds its key. The rules are :mod:`django_inbox.ordered.ordering`'s."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction

from .. import clock, events
from ..db.statements import NewRow
from ..exceptions import LeaseLost
from ..models import InboxMessage
from ..outcomes import Outcome
from ..processing import leases
from . import ordering, rebuilds, waits
from .ordering import Verdict

Status = InboxMessage.Status

#: A claimed row whose key another transaction holds is due again after this many seconds.
BUSY_DELAY = 0.2


@dataclass
class Hold:
    """What :func:`hold` decided for a claimed version, in its transaction.

    ``outcome`` is ``None`` when the handler is to run: then ``completed`` says that the
    version's completion is written already (the inbox has nothing left to write after the
    handler), and ``applied`` that its key was moved to it already. ``released`` holds the
    message ids of versions the decision made due (a re-run's end, a skip's successors).
    """

    outcome: Outcome | None
    applied: bool = False
    completed: bool = False
    released: list[str] = field(default_factory=list)


def hold(message: InboxMessage, using: str) -> Hold:
    """For a claimed row of an ordered consumer, in its transaction: lock its key and decide:
    run the handler (``outcome`` ``None``), or the row is ``skipped`` or ``waiting`` (its
    claim's attempt taken back), or ``IN_PROGRESS`` when another transaction holds the key.
    Raises :class:`LeaseLost` when the row's lease is no longer this worker's."""
    state, moved, completed, released = ordering.lock_for_worker(message, using)
    if completed is False:
        raise LeaseLost(message.pk)
    result = Hold(None, applied=moved, completed=bool(completed), released=released)
    rerun = bool(message.rerun)
    verdict = ordering.decide(message.sequence, state, rerun=rerun)
    if verdict is Verdict.BUSY:
        result.outcome = Outcome.IN_PROGRESS
        return result
    assert state is not None
    now = clock.now()
    if state.rebuilding and not rerun:  # a re-run with nothing left to run is over
        state, ended = rebuilds.finish_rebuild(message.consumer, message.key, state, now, using)
        result.released += ended
        verdict = ordering.decide(message.sequence, state, rerun=rerun)
    skip = message.skip_requested
    if verdict is Verdict.RUN and not skip:
        return result
    assert message.sequence is not None
    if verdict is Verdict.RUN:  # an operator skipped it ahead: it counts as applied
        status, outcome, until = Status.SKIPPED, Outcome.SKIPPED, None
        reason = ordering.skipped_reason(ordering.skip_entry(message))
        consumer, key, sequence = message.consumer, message.key, message.sequence
        if moved:
            result.released += ordering.release_next(consumer, key, sequence + 1, now, using)
        else:
            result.released += ordering.advance(consumer, key, sequence, now, using)
        if rerun:
            result.released += rebuilds.after_rerun(message, using)
    elif verdict is Verdict.SKIP:
        status, outcome, until = Status.SKIPPED, Outcome.SKIPPED, None
        reason = ordering.stale_reason(message.key, message.sequence, state, rerun=rerun)
    else:
        status, outcome = Status.WAITING, Outcome.WAITING
        until = waits.deadline(
            message.consumer,
            message.key,
            message.sequence,
            now,
            using,
            rerun=rerun,
            through=state.rebuild_through,
        )
        reason = ordering.waiting_reason(message.key, message.sequence, state, rerun=rerun)
        if skip:
            reason = f"{ordering.skipped_reason(ordering.skip_entry(message))}; {reason}"
    if not ordering.set_aside(message, status, until, reason, now, using):
        raise LeaseLost(message.pk)
    result.outcome = outcome
    return result


def place_new(row: NewRow, now: datetime, using: str) -> tuple[Verdict, list[str]]:
    """For a new keyed version of an ordered consumer that ``deliver()`` is about to insert, in
    its transaction: lock its key and decide, setting the row's status, reason and deadline
    (``RUN``: inserted ``completed``, the caller runs the handler). Returns the verdict and the
    message ids a re-run's end made due."""
    state = ordering.lock(row.consumer, row.key, using, wait=True)
    assert state is not None
    released: list[str] = []
    if state.rebuilding:  # a re-run with nothing left to run is over
        state, released = rebuilds.finish_rebuild(row.consumer, row.key, state, now, using)
    verdict = ordering.decide(row.sequence, state, rerun=False)
    if verdict is Verdict.RUN:
        row.status, row.attempts, row.processed_at = Status.COMPLETED, 1, now
        return verdict, released
    assert row.sequence is not None
    if verdict is Verdict.SKIP:
        row.status, row.processed_at = Status.SKIPPED, now
        row.last_error = ordering.stale_reason(row.key, row.sequence, state)
    else:
        row.status = Status.WAITING
        row.next_attempt_at = waits.deadline(
            row.consumer, row.key, row.sequence, now, using, through=state.rebuild_through
        )
        row.last_error = ordering.waiting_reason(row.key, row.sequence, state)
    return verdict, released


def held_back(message: InboxMessage, outcome: Outcome, using: str) -> Outcome:
    """Report a row :func:`hold` did not run; give back one whose key was busy."""
    if outcome is Outcome.IN_PROGRESS:
        now = clock.now()
        with transaction.atomic(using=using):
            leases.release(message, now, using, due=now + timedelta(seconds=BUSY_DELAY))
        return outcome
    events.event(str(outcome), **events.about(message, using, attempt=message.attempts - 1))
    return outcome
