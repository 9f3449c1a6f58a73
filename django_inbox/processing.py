"""Claiming stored rows and running their handlers: the one code path every worker uses.

A claim commits ``in_progress``, the counted attempt and a lease (``lease_id`` plus
``locked_until``) *before* the handler runs, so a message that kills its worker still reaches
``dead`` after ``max_attempts``. The handler's writes commit together with a fenced
``UPDATE … WHERE lease_id = <ours>``: a worker whose lease was taken over updates nothing and
rolls its work back.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.utils import timezone

from . import history, interruptions, observe
from .conf import inbox_settings
from .db.connection import connection_lost
from .exceptions import ConnectionLost, LeaseLost, Park, Reject, Retry, TransactionAborted
from .models import POLLED_STATUSES, InboxMessage
from .outcomes import Outcome
from .recovery import (
    SHARED_TRANSACTION,
    record_abandoned_attempt,
    release_unstarted,
    split_blame,
    whole_leases,
)
from .registry import Handler, registry
from .retry import RetryPolicy
from .storage import complete_row, transaction_aborted

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status


def no_handler_reason(consumer: str, event_type: str) -> str:
    return (
        f"no handler is registered for event type {event_type!r} in consumer {consumer!r}; "
        "replay the message once one exists"
    )


def claim_batch(
    consumer: str,
    limit: int,
    *,
    using: str | None = None,
    message_id: str | None = None,
    shared_transaction: bool = False,
) -> list[InboxMessage]:
    """Claim up to ``limit`` due rows of ``consumer`` and return them, attempt counted.

    Due rows are ``received`` ones, ``failed`` ones whose ``next_attempt_at`` has come and
    ``in_progress`` ones whose lease expired (see :func:`_take_over`). Rows locked by another
    claimer are skipped, never waited for. The returned rows must be processed in the order
    given (by primary key): :func:`_take_over` relies on it to tell which row of a dead
    worker's batch was running. ``message_id`` restricts the claim to that one message.
    ``shared_transaction`` marks the batch for :func:`process_batch`, unless it takes over
    rows of a dead worker: those are always run one transaction each.
    """
    using = using or inbox_settings.database
    lease_id = (SHARED_TRANSACTION if shared_transaction else "") + uuid.uuid4().hex
    try:
        return _claim(consumer, limit, using, message_id, lease_id)
    except Exception as exc:
        # The claim may have committed with its reply lost: its rows hold a lease nobody
        # knows. Give them back, uncounted, once the database is reachable again.
        if connection_lost(exc, using):
            for lease in {lease_id, _solo(lease_id)}:
                interruptions.note([], using=using, lease_id=lease, error=exc)
        raise


def _solo(lease_id: str) -> str:
    """The lease a claim uses when it takes over a dead worker's rows (never shared)."""
    return lease_id.removeprefix(SHARED_TRANSACTION)


def _claim(
    consumer: str,
    limit: int,
    using: str,
    message_id: str | None,
    lease_id: str,
) -> list[InboxMessage]:
    if message_id is None and connections[using].vendor == "postgresql":
        # Usually nothing was abandoned: claim new and due rows in one statement, and look
        # for dead workers' rows (the general path below) at least every second.
        checked = time.monotonic() - _takeover_checked.get((using, consumer), 0.0)
        if checked < TAKEOVER_CHECK_INTERVAL:
            claimed = claim_fresh(consumer, limit, using, lease_id)
            if claimed:
                return claimed
        _takeover_checked[(using, consumer)] = time.monotonic()
    now = timezone.now()
    rows = InboxMessage.objects.using(using)
    due = rows.due(now).filter(consumer=consumer)
    if message_id is not None:
        due = due.filter(message_id=message_id)
    with transaction.atomic(using=using):
        candidates = list(
            due.order_by("next_attempt_at", "pk")
            .select_for_update(skip_locked=True)
            .only(*_CLAIM_FIELDS)[:limit]
        )
        abandoned = [row for row in candidates if row.status == Status.IN_PROGRESS]
        dropped = _take_over(abandoned, now, using) if abandoned else set()
        ids = [row.pk for row in candidates if row.pk not in dropped]
        if not ids:
            return []
        if abandoned:
            lease_id = _solo(lease_id)  # a dead worker's rows run one transaction each
        until = now + timedelta(seconds=inbox_settings.policy(consumer).lease)
        rows.filter(pk__in=ids, status__in=POLLED_STATUSES, next_attempt_at__lte=now).update(
            status=Status.IN_PROGRESS,
            attempts=F("attempts") + 1,
            lease_id=lease_id,
            locked_until=until,
            next_attempt_at=until,
            updated_at=now,
        )
        return list(rows.filter(pk__in=ids, lease_id=lease_id).order_by("pk"))


#: Seconds a worker may go on claiming with :func:`claim_fresh` before it looks for rows of
#: dead workers again.
TAKEOVER_CHECK_INTERVAL = 1.0
_takeover_checked: dict[tuple[str, str], float] = {}


def claim_fresh(consumer: str, limit: int, using: str, lease_id: str) -> list[InboxMessage]:
    """PostgreSQL: claim ``received`` and due ``failed`` rows in one statement.

    ``UPDATE … WHERE id = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED)) RETURNING …`` in
    autocommit: the claim, its counted attempt and the lease commit together, one round trip
    per batch. ``= ANY(ARRAY(…))`` makes PostgreSQL run the locking subquery once; under
    ``IN (…)`` it may rescan it per row and claim more than ``limit`` rows.
    Rows of dead workers are left to :func:`claim_batch`'s general path.
    """
    connection = connections[using]
    quote = connection.ops.quote_name
    table = quote(InboxMessage._meta.db_table)
    names = [field.attname for field in InboxMessage._meta.concrete_fields]
    now = timezone.now()
    until = now + timedelta(seconds=inbox_settings.policy(consumer).lease)
    sql = (
        f"UPDATE {table} SET {quote('status')} = %s, {quote('attempts')} = "
        f"{quote('attempts')} + 1, {quote('lease_id')} = %s, {quote('locked_until')} = %s, "
        f"{quote('next_attempt_at')} = %s, {quote('updated_at')} = %s "
        f"WHERE {quote('id')} = ANY(ARRAY(SELECT {quote('id')} FROM {table} "
        f"WHERE {quote('consumer')} = %s AND {quote('status')} IN (%s, %s) "
        f"AND {quote('next_attempt_at')} <= %s "
        f"ORDER BY {quote('next_attempt_at')}, {quote('id')} LIMIT %s FOR UPDATE SKIP LOCKED)) "
        f"RETURNING {', '.join(quote(name) for name in names)}"
    )
    params: list[Any] = [
        Status.IN_PROGRESS.value, lease_id, until, until, now,
        consumer, Status.RECEIVED.value, Status.FAILED.value, now, limit,
    ]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    json_fields = {
        index: InboxMessage._meta.get_field(name)
        for index, name in enumerate(names)
        if name in ("payload", "headers", "history")
    }
    rows = []
    for values in found:
        row = list(values)
        for index, field in json_fields.items():
            row[index] = field.from_db_value(row[index], None, connection)  # type: ignore[union-attr]
        rows.append(InboxMessage.from_db(using, names, row))
    rows.sort(key=lambda message: message.pk)
    return rows


_CLAIM_FIELDS = (
    "id",
    "consumer",
    "status",
    "attempts",
    "event_type",
    "history",
    "message_id",
    "lease_id",
)


def _take_over(abandoned: list[InboxMessage], now: datetime, using: str) -> set[int]:
    """Prepare rows whose lease expired for a new claim; return the pks not to claim.

    Only the row that was running when its worker died has its attempt counted (see
    :func:`~django_inbox.recovery.split_blame`); it is claimed again at once unless that
    used up its attempts. Its batch-mates lose the attempt their dead claim counted.

    A dead worker's batch is decided whole, in this transaction: rows of it beyond this
    claim's limit are locked too and given back (the blamed one as ``failed`` after its
    backoff, the others due now), so a later claim cannot blame a second row of it. A batch
    partly locked by another process is left alone for a later claim.
    """
    whole, _ = whole_leases(abandoned, InboxMessage.objects.using(using).stale(now), using)
    claiming = {row.pk for row in abandoned}
    dropped = claiming - {row.pk for row in whole}
    blamed, innocent = split_blame(whole, using)
    rows = InboxMessage.objects.using(using)
    for row in innocent:
        if row.pk in claiming:
            rows.filter(pk=row.pk).update(attempts=F("attempts") - 1)
        else:
            release_unstarted(row, now, using)
    for row in blamed:
        status = record_abandoned_attempt(row, now, using, retry_now=row.pk in claiming)
        if status == Status.DEAD:
            dropped.add(row.pk)
    return dropped


def process_claimed(message: InboxMessage, *, using: str | None = None) -> Outcome:
    """Run the handler of a claimed row and record what happened.

    The handler's writes and the ``completed`` status commit in one transaction, fenced on the
    row's lease. A handler exception rolls the writes back and is recorded in a transaction
    of its own. Returns ``IN_PROGRESS`` when the lease was lost to another worker.
    """
    using = using or inbox_settings.database
    handler = registry.get(message.consumer, message.event_type)
    if handler is None:
        reason = no_handler_reason(message.consumer, message.event_type)
        return record_failure(message, Reject(reason), None, using=using)
    started = time.perf_counter()
    try:
        with committing(using, lambda: [message.pk]):
            run_handler(handler, message, using)
            if not complete_row(message.pk, message.lease_id, timezone.now(), using):
                raise LeaseLost(message.pk)
    except LeaseLost:
        logger.warning(
            "inbox message %s: lease lost to another worker; this attempt's work was rolled back",
            message.message_id,
        )
        return Outcome.IN_PROGRESS
    except Exception as exc:
        if connection_lost(exc, using):
            raise  # infrastructure, not the handler: the caller gives the row back later
        duration = time.perf_counter() - started
        return record_failure(message, exc, handler, using=using, duration=duration)
    processed(message, time.perf_counter() - started, using)
    return Outcome.PROCESSED


@contextmanager
def committing(using: str, pks: Callable[[], list[int]]) -> Iterator[None]:
    """``transaction.atomic()`` that does not take a failing ``on_commit`` callback for a
    failure of its body.

    Django runs the callbacks after the commit, inside ``atomic``'s exit, so their exception
    comes out of the block as if the work had failed. Here an exception raised after the body
    finished is swallowed (and logged: type and frames, not its message) when the commit did
    happen, i.e. the rows ``pks()`` are ``completed``; any other exception propagates.
    """
    body_done = False
    try:
        with transaction.atomic(using=using):
            yield
            body_done = True
    except Exception as exc:
        # A lost connection is not asked whether it committed: the check would open a new one
        # and hide the loss from the caller.
        if not body_done or connection_lost(exc, using) or not _committed(exc, pks(), using):
            raise


def _committed(exc: Exception, pks: list[int], using: str) -> bool:
    if connections[using].in_atomic_block:
        return False  # a savepoint: nothing committed, and no callback has run yet
    try:
        done = InboxMessage.objects.using(using).filter(pk__in=pks, status=Status.COMPLETED)
        committed = done.count() == len(pks)
    except Exception:
        return False
    if committed:
        logger.error(
            "inbox: a transaction.on_commit callback raised after %d message(s) committed; "
            "they are completed. Use on_commit(..., robust=True) for callbacks that may fail: %s",
            len(pks),
            observe.exception_text(exc),
        )
    return committed


def processed(message: InboxMessage, duration: float | None, using: str) -> None:
    observe.event(
        "processed",
        consumer=message.consumer,
        message_id=message.message_id,
        event_type=message.event_type,
        pk=message.pk,
        attempt=message.attempts,
        duration=duration,
        message=message,
        using=using,
    )


def process_batch(messages: list[InboxMessage], *, using: str | None = None) -> list[Outcome]:
    """Run the handlers of several claimed rows in one transaction, completing all together.

    One commit for the batch instead of one per message. If any handler raises (or a lease
    was lost), the whole transaction rolls back and each message is run again in its own
    transaction, so a failure is recorded against the message that caused it: the other
    handlers' bodies then run twice, which is why this is opt-in (``commit_every``).
    """
    using = using or inbox_settings.database
    if len(messages) < 2:
        return [process_claimed(message, using=using) for message in messages]
    handlers = [registry.get(m.consumer, m.event_type) for m in messages]
    started = time.perf_counter()
    pks = [m.pk for m in messages]
    try:
        with committing(using, lambda: pks):
            for message, handler in zip(messages, handlers, strict=True):
                if handler is None:
                    raise LeaseLost(message.pk)  # not an error here: handled one by one below
                run_handler(handler, message, using)
            if complete_rows(pks, messages[0].lease_id, using) != len(messages):
                raise LeaseLost(messages[0].pk)
    except Exception as exc:
        if connection_lost(exc, using):
            raise  # nothing committed; the caller gives the rows back later
        return [process_claimed(message, using=using) for message in messages]
    share = (time.perf_counter() - started) / len(messages)
    for message in messages:
        processed(message, share, using)
    return [Outcome.PROCESSED] * len(messages)


def complete_rows(pks: list[int], lease_id: str, using: str) -> int:
    """Mark claimed rows completed where ``lease_id`` still holds them; return how many."""
    now = timezone.now()
    return (
        InboxMessage.objects.using(using)
        .filter(pk__in=pks, lease_id=lease_id, status=Status.IN_PROGRESS)
        .update(
            status=Status.COMPLETED,
            processed_at=now,
            updated_at=now,
            locked_until=None,
            next_attempt_at=None,
            lease_id="",
            last_error="",
        )
    )


def run_handler(handler: Handler, message: InboxMessage, using: str) -> None:
    """Call the handler inside the caller's transaction; refuse to commit an aborted one."""
    handler.func(message)
    if transaction_aborted(using):
        raise TransactionAborted(
            "the handler caught a database error without a savepoint, so its transaction "
            "cannot commit; let the error propagate or wrap the statement in "
            "transaction.atomic()"
        )


def failure_outcome(
    exc: BaseException, attempts: int, policy: RetryPolicy
) -> tuple[str, float | None]:
    """The status after a failed attempt and, for ``failed``, the delay before the next one."""
    if isinstance(exc, Reject):
        return Status.DEAD, None
    if isinstance(exc, Park):
        return Status.PARKED, None
    if attempts >= policy.max_attempts:
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
    now = timezone.now()
    policy = RetryPolicy.for_handler(message.consumer, handler)
    status, delay = failure_outcome(exc, message.attempts, policy)
    next_attempt_at = None if delay is None else now + timedelta(seconds=delay)
    entry = history.error_entry(
        exc, attempt=message.attempts, at=now, outcome=status, retry_at=next_attempt_at
    )
    with transaction.atomic(using=using):
        updated = (
            InboxMessage.objects.using(using)
            .filter(pk=message.pk, lease_id=message.lease_id, status=Status.IN_PROGRESS)
            .update(
                status=status,
                last_error=history.summary(entry),
                history=history.append(message.history, entry),
                next_attempt_at=next_attempt_at,
                locked_until=None,
                lease_id="",
                updated_at=now,
            )
        )
    if not updated:
        logger.warning(
            "inbox message %s: lease lost before its failure could be recorded", message.message_id
        )
        return Outcome.IN_PROGRESS
    failure(message, entry, status, next_attempt_at, using=using, duration=duration)
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
    observe.event(
        status,
        consumer=message.consumer,
        message_id=message.message_id,
        event_type=message.event_type,
        pk=message.pk,
        attempt=entry["attempt"],
        duration=duration,
        message=message,
        using=using,
        error_type=entry["type"],
        retry_at=next_attempt_at,
    )


def release(messages: list[InboxMessage], *, using: str | None = None) -> int:
    """Give back claimed rows that were never started (e.g. on shutdown), attempt uncounted."""
    using = using or inbox_settings.database
    now = timezone.now()
    with transaction.atomic(using=using):
        return sum(release_unstarted(message, now, using) for message in messages)


def give_back_interrupted(using: str | None = None) -> int:
    """Give back the rows noted in :mod:`~django_inbox.interruptions`; return how many.

    Call once the database answers again. Rows that were waiting are due now with their
    attempt uncounted; the row that was running gets an ``interrupted`` history entry, free
    for its first ``max_attempts`` interruptions and recorded as a failed attempt
    (``ConnectionLost``) after that. Rows another worker took over meanwhile are left alone.
    """
    using = using or inbox_settings.database
    if not interruptions.pending():
        return 0
    noted = interruptions.take(using)
    given = 0
    try:
        now = timezone.now()
        with transaction.atomic(using=using):
            for entry in noted:
                if entry.lease_id is not None:
                    given += interruptions.release_lease(entry.lease_id, now, using)
                for row in entry.rows:
                    if row is not entry.running:
                        given += release_unstarted(row, now, using)
        for entry in noted:
            if entry.running is not None:
                given += _give_back_running(entry.running, entry.error, using)
    except Exception:
        interruptions.put_back(noted)
        raise
    return given


def _give_back_running(row: InboxMessage, error: str, using: str) -> int:
    handler = registry.get(row.consumer, row.event_type)
    if (
        interruptions.free_interruptions(row)
        < RetryPolicy.for_handler(row.consumer, handler).max_attempts
    ):
        return interruptions.release_interrupted(row, error, using)
    reason = (
        f"the database connection was lost during attempt {row.attempts}"
        + (f" ({error})" if error else "")
        + "; this message's earlier interruptions used up its free ones, so this one counts"
    )
    outcome = record_failure(row, ConnectionLost(reason), handler, using=using)
    return 0 if outcome is Outcome.IN_PROGRESS else 1
