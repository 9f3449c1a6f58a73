"""One attempt of a claimed row: the handler's call, its commit, and what a failure becomes.

The handler's writes and the ``completed`` status commit in one transaction, fenced on the
row's lease (:mod:`django_inbox.processing.leases`). A handler exception rolls the writes back
and is recorded in a transaction of its own: ``failed`` with a backoff, ``dead`` or ``parked``.
A lost database connection is not the handler's failure: it is raised to the caller, which gives the
row back once the database answers
(:func:`~django_inbox.processing.giving_back.give_back_interrupted`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from .. import clock, events, history, reporting
from ..conf import inbox_settings
from ..db.connection import conflicted, connection_lost
from ..db.json import unreadable
from ..exceptions import (
    LeaseLost,
    Park,
    Reject,
    Retry,
    UnreadableMessage,
)
from ..models import InboxMessage
from ..ordered import holding, ordering, rebuilds
from ..outcomes import Outcome
from ..registry import Handler, registry
from . import interruptions, leases
from .calling import run_handler
from .commits import committing, not_the_handlers, own_statements
from .retry import RetryPolicy

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status


def no_handler_reason(consumer: str, event_type: str) -> str:
    return (
        f"no handler is registered for event type {event_type!r} in consumer {consumer!r}; "
        "replay the message once one exists"
    )


@dataclass(frozen=True)
class Attempted:
    """What one attempt of a claimed row came to: its outcome, and the message ids of the
    ordered versions it made due (they can run next, in transactions of their own)."""

    outcome: Outcome
    released: tuple[str, ...] = ()


def process_claimed(message: InboxMessage, *, using: str | None = None) -> Outcome:
    """Run the handler of a claimed row and record what happened; see :func:`attempt`."""
    return attempt(message, using=using).outcome


def attempt(message: InboxMessage, *, using: str | None = None) -> Attempted:
    """Run the handler of a claimed row and record what happened.

    The handler's writes and the ``completed`` status commit in one transaction, fenced on the
    row's lease. A handler exception rolls the writes back and is recorded in a transaction
    of its own. The outcome is ``IN_PROGRESS`` when the lease was lost to another worker.
    """
    using = using or inbox_settings.database
    handler = registry.get(message.consumer, message.event_type)
    if handler is None:
        reason = no_handler_reason(message.consumer, message.event_type)
        return Attempted(record_failure(message, Reject(reason), None, using=using))
    problem = unreadable_reason(message)
    if problem is not None:
        return Attempted(record_failure(message, UnreadableMessage(problem), None, using=using))
    ordered = ordering.applies(message.consumer, message.key)
    held = holding.Hold(None)
    released: list[str] = []
    started = time.perf_counter()
    try:
        with committing(using, lambda: [] if held.outcome is not None else [message.pk]):
            if ordered:
                held = holding.hold(message, using)
                released = held.released
            if held.outcome is None:
                run_handler(handler, message, using)
                now = clock.now()
                with own_statements():
                    if held.completed:
                        completed = True  # completed with its key's lock, before the handler
                    elif ordered and message.sequence is not None:
                        completed, released = ordering.complete(
                            message, now, using, applied=held.applied
                        )
                    else:
                        completed = leases.complete(message, now, using)
                if not completed:
                    raise LeaseLost(message.pk)
                if ordered and message.rerun:  # the re-run's last version ends the re-run
                    released = [*released, *rebuilds.after_rerun(message, using)]
        if held.outcome is not None:
            return Attempted(holding.held_back(message, held.outcome, using), tuple(released))
    except LeaseLost:
        logger.warning(
            "inbox message %s: lease lost to another worker; nothing of this attempt was kept",
            message.message_id,
        )
        return Attempted(Outcome.IN_PROGRESS)  # what it released rolled back with the rest
    except Exception as exc:
        if not_the_handlers(exc, using):
            # Infrastructure, or the inbox's own completion timed out or met a conflict: not
            # the handler's failure. The caller gives the row back later, uncounted.
            raise
        duration = time.perf_counter() - started
        return Attempted(record_failure(message, exc, handler, using=using, duration=duration))
    processed(message, time.perf_counter() - started, using)
    return Attempted(Outcome.PROCESSED, tuple(released))


def unreadable_reason(message: InboxMessage) -> str | None:
    """Why a claimed row's payload or headers cannot be shown to a handler, or ``None``."""
    why = unreadable(payload=message.payload, headers=message.headers)
    return f"{why}; the handler did not run" if why else None


def attempt_one(claimed: list[InboxMessage], using: str) -> Attempted:
    """Attempt the row a claim by id returned; if the database connection is lost meanwhile
    (or the inbox's own completion timed out), note the row to give back once the database
    answers (the error is raised on)."""
    try:
        return attempt(claimed[0], using=using)
    except Exception as exc:
        if connection_lost(exc, using) or conflicted(exc):  # what attempt() did not record
            interruptions.note(claimed, using=using, running=claimed[0], error=exc)
        raise


def run_released(
    consumer: str,
    message_ids: list[str],
    using: str,
    *,
    limit: int | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[Outcome]:
    """Run the versions a completed message of an ordered consumer made due, and those they
    make due in turn, each in its own transaction; return their outcomes. At most ``limit``
    of them, and none once ``stop()`` says so: the rest are ``received``, due now, for the
    next worker pass."""
    from .claims import claim_batch

    outcomes: list[Outcome] = []
    pending = list(message_ids)
    while pending and (limit is None or len(outcomes) < limit) and not (stop and stop()):
        claimed = claim_batch(consumer, 1, using=using, message_id=pending.pop(0))
        if not claimed:
            continue
        attempted = attempt_one(claimed, using)
        outcomes.append(attempted.outcome)
        pending.extend(attempted.released)
    return outcomes


def processed(message: InboxMessage, duration: float | None, using: str) -> None:
    events.event("processed", **events.about(message, using), duration=duration, message=message)


class _OneByOne(Exception):
    """A batch that must run one row at a time (a row without a handler): not an error."""


def process_batch(messages: list[InboxMessage], *, using: str | None = None) -> list[Attempted]:
    """Run the handlers of several claimed rows in one transaction, completing all together.

    One commit for the batch instead of one per message. If any handler raises (or a lease
    was lost), the whole transaction rolls back and each message is run again in its own
    transaction, so a failure is recorded against the message that caused it: the other
    handlers' bodies then run twice, which is why this is opt-in (``commit_every``).
    """
    using = using or inbox_settings.database
    if (
        len(messages) < 2
        or any(ordering.applies(m.consumer, m.key) for m in messages)
        or any(unreadable_reason(m) for m in messages)
    ):
        # An ordered consumer's keyed rows decide run, skip or wait one transaction each.
        return [attempt(message, using=using) for message in messages]
    handlers = [registry.get(m.consumer, m.event_type) for m in messages]
    started = time.perf_counter()
    pks = [m.pk for m in messages]
    histories = [m.history for m in messages]  # a re-run adds its suppressed calls to these
    try:
        with committing(using, lambda: pks):
            for message, handler in zip(messages, handlers, strict=True):
                if handler is None:
                    raise _OneByOne  # each row's failure is recorded alone, below
                run_handler(handler, message, using)
            if leases.complete_all(messages, using) != len(messages):
                raise LeaseLost(messages[0].pk)
    except Exception as exc:
        if connection_lost(exc, using):
            raise  # nothing committed; the caller gives the rows back later
        for message, kept in zip(messages, histories, strict=True):
            message.history = kept  # the batch's attempt rolled back, its trace with it
        return [attempt(message, using=using) for message in messages]
    share = (time.perf_counter() - started) / len(messages)
    for message in messages:
        processed(message, share, using)
    return [Attempted(Outcome.PROCESSED)] * len(messages)


def failure_outcome(
    exc: BaseException, attempts: int, policy: RetryPolicy
) -> tuple[str, float | None]:
    """The status after a failed attempt and, for ``failed``, the delay before the next one."""
    if isinstance(exc, Reject):
        return Status.DEAD, None
    if isinstance(exc, Park):
        return Status.PARKED, None
    if policy.used_up(attempts):
        return Status.DEAD, None
    if isinstance(exc, Retry) and exc.delay is not None:
        return Status.FAILED, exc.delay
    return Status.FAILED, policy.delay(attempts)


def record_failure(
    message: InboxMessage,
    exc: BaseException,
    handler: Handler | None,
    *,
    using: str,
    duration: float | None = None,
) -> Outcome:
    """Record a failed attempt of a claimed row, fenced on its lease."""
    now = clock.now()
    policy = RetryPolicy.for_handler(message.consumer, handler)
    status, delay = failure_outcome(exc, message.attempts, policy)
    next_attempt_at = None if delay is None else now + timedelta(seconds=delay)
    entry = history.error_entry(
        exc, attempt=message.attempts, at=now, outcome=status, retry_at=next_attempt_at
    )
    with transaction.atomic(using=using):
        updated = leases.fail(message, status, entry, next_attempt_at, now, using)
    if not updated:
        logger.warning(
            "inbox message %s: lease lost before its failure could be recorded", message.message_id
        )
        return Outcome.IN_PROGRESS
    failure(message, entry, status, next_attempt_at, using=using, duration=duration)
    if handler is not None:
        reporting.handler_failed(exc, message)
    return Outcome(status)


def failure(
    message: InboxMessage,
    entry: dict[str, Any],
    status: str,
    next_attempt_at: datetime | None,
    *,
    using: str,
    duration: float | None = None,
) -> None:
    """Report a failed attempt: a log line (ids and the error type, never the payload) and
    the ``message_failed`` / ``message_dead`` / ``message_parked`` signal."""
    events.event(
        status,
        **events.about(message, using, attempt=entry["attempt"]),
        duration=duration,
        message=message,
        error_type=entry["type"],
        retry_at=next_attempt_at,
    )
