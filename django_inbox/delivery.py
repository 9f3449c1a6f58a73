"""``deliver()`` and ``store()``: how messages enter the inbox."""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from . import history, interruptions, observe
from .conf import inbox_settings
from .db.connection import connection_lost
from .exceptions import InvalidMessage, InvalidPayload, Reject, UnknownConsumer, UnknownEventType
from .models import InboxMessage
from .outcomes import Outcome
from .processing import (
    claim_batch,
    committing,
    failure,
    failure_outcome,
    give_back_interrupted,
    no_handler_reason,
    process_claimed,
    processed,
    run_handler,
)
from .registry import Handler, registry
from .retry import RetryPolicy
from .storage import NewRow, insert_completed_rows, insert_row
from .text import storable, storable_json
from .validation import CONSUMER_MAX, TEXT_MAX, clean_message_id, clean_text, encode_json

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status

_STATUS_OUTCOMES = {
    Status.COMPLETED: Outcome.DUPLICATE,
    Status.DEAD: Outcome.DEAD,
    Status.PARKED: Outcome.PARKED,
    Status.FAILED: Outcome.FAILED,
    Status.IN_PROGRESS: Outcome.IN_PROGRESS,
    # A ``received`` row we could not claim is being claimed by a worker right now.
    Status.RECEIVED: Outcome.IN_PROGRESS,
}


def _prepare(
    consumer: str,
    message_id: object,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None,
    source: str | None,
    key: str | None,
) -> NewRow:
    """Validate every argument; raise an :class:`~django_inbox.InvalidMessage` subclass."""
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidPayload(f"headers must be a mapping, got {type(headers).__name__}")
    max_bytes = inbox_settings.max_payload_bytes
    return NewRow(
        consumer=clean_text("consumer", consumer, required=True, max_length=CONSUMER_MAX),
        message_id=clean_message_id(message_id),
        event_type=clean_text("event_type", event_type, required=True),
        source=clean_text("source", source, required=False),
        key=clean_text("key", key, required=False),
        payload=encode_json("payload", payload, max_bytes=max_bytes),
        # Headers are what a broker or sender added: their text is made storable, not refused.
        headers=encode_json("headers", storable_json(dict(headers or {})), max_bytes=max_bytes),
    )


def prepare(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
) -> NewRow:
    """Validate a message for :func:`deliver_batch`; raise :class:`InvalidMessage` if bad."""
    return _prepare(consumer, message_id, event_type, payload, headers, source, key)


def deliver_batch(rows: list[NewRow]) -> list[Outcome]:
    """Deliver several prepared messages in one transaction; one :class:`Outcome` each.

    The new messages' rows go in with one statement, every handler runs in the same
    transaction, and one commit covers them all. If any handler raises, the transaction rolls
    back and each message is delivered again on its own (its handler then runs twice, as with
    ``commit_every``), so a failure is recorded against the message that caused it.
    """
    using = inbox_settings.database
    rows = [_fresh(row) for row in rows]  # the caller's rows stay as given, to try again
    handlers = [registry.get(row.consumer, row.event_type) for row in rows]
    if len(rows) < 2 or None in handlers:
        return [_deliver_row(row, using) for row in rows]
    now = timezone.now()
    for row in rows:
        row.status, row.attempts, row.processed_at = Status.COMPLETED, 1, now
    ran: dict[tuple[str, str], InboxMessage] = {}
    started = time.perf_counter()
    try:
        with committing(using, lambda: [message.pk for message in ran.values()]):
            new = insert_completed_rows(rows, now, using)
            for row, handler in zip(rows, handlers, strict=True):
                key = (row.consumer, row.message_id)
                if key in new and key not in ran:
                    ran[key] = message = _materialise(row, new[key], using)
                    run_handler(handler, message, using)  # type: ignore[arg-type]
    except Exception as exc:
        if connection_lost(exc, using):
            raise  # nothing committed (or unknown): the caller tries the batch again later
        logger.info("inbox batch of %d rolled back; delivering one by one", len(rows))
        return [_deliver_row(_fresh(row), using) for row in rows]
    share = (time.perf_counter() - started) / max(len(ran), 1)
    outcomes: list[Outcome] = []
    for row in rows:
        key = (row.consumer, row.message_id)
        if key in ran:
            processed(ran.pop(key), share, using)
            outcomes.append(Outcome.PROCESSED)
        else:  # a duplicate: of a row committed earlier, or of one earlier in this batch
            outcomes.append(_deliver_existing(_fresh(row), using))
    return outcomes


def _fresh(row: NewRow) -> NewRow:
    """The message as it arrived, without any state a delivery attempt put on it."""
    return NewRow(
        consumer=row.consumer,
        message_id=row.message_id,
        event_type=row.event_type,
        payload=row.payload,
        headers=row.headers,
        source=row.source,
        key=row.key,
    )


def _unhandled(row: NewRow, using: str) -> Outcome | None:
    """Keep a message nobody handles as ``dead`` (or refuse it); ``None`` if it existed.

    A consumer without any handler is refused: a typo in its name, or handler modules that
    were not loaded, would otherwise turn every message into a dead letter.
    """
    if not registry.knows(row.consumer):
        raise UnknownConsumer(
            f"no handler is registered for consumer {row.consumer!r}; known consumers: "
            f"{registry.consumers()!r}"
        )
    reason = no_handler_reason(row.consumer, row.event_type)
    if inbox_settings.unhandled == "refuse":
        raise UnknownEventType(reason)
    return Outcome.DEAD if _insert_dead(row, reason, "NoHandler", using) else None


def _insert_dead(row: NewRow, reason: str, error_type: str, using: str) -> bool:
    now = timezone.now()
    entry = history.error_entry(
        Reject(reason), attempt=0, at=now, outcome=Status.DEAD, error_type=error_type
    )
    row.status = Status.DEAD
    row.last_error = history.summary(entry)
    row.history = json.dumps([entry])
    pk = insert_row(row, now, using)
    if pk is None:
        return False
    observe.event(
        "dead",
        consumer=row.consumer,
        message_id=row.message_id,
        event_type=row.event_type,
        pk=pk,
        using=using,
        error_type=error_type,
        detail="stored dead",
    )
    return True


def store_dead(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    reason: str,
    error_type: str = "Refused",
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
) -> bool:
    """Keep a message that can never be handled as ``dead``, with the reason; ``True`` if new.

    For what a consumer cannot even decode (a body that is not JSON, an unsupported content
    type, a payload over the size limit): the message is kept where an operator sees it,
    instead of being dropped or retried in a loop. ``payload`` should be what is left of it
    (e.g. the raw body). Takes the other arguments of :func:`deliver`.

    Being the last resort, it stores what it can: text fields are made storable and cut to
    their column, and headers or a payload that cannot be stored are replaced by a note
    saying why. Only an unusable ``consumer`` or ``message_id`` raises
    :class:`~django_inbox.InvalidMessage`: without them there is no row to keep.
    """
    max_bytes = inbox_settings.max_payload_bytes
    row = NewRow(
        consumer=clean_text("consumer", consumer, required=True, max_length=CONSUMER_MAX),
        message_id=clean_message_id(message_id),
        event_type=storable(event_type or "unknown")[:TEXT_MAX],
        source=storable(source or "")[:TEXT_MAX],
        key=storable(key or "")[:TEXT_MAX],
        payload=_encode_or_note("payload", payload, max_bytes),
        headers=_encode_or_note(
            "headers", dict(headers) if isinstance(headers, Mapping) else {}, max_bytes
        ),
    )
    return _insert_dead(row, reason, error_type, inbox_settings.database)


def _encode_or_note(name: str, value: Any, max_bytes: int) -> str:
    try:
        return encode_json(name, storable_json(value), max_bytes=max_bytes)
    except InvalidMessage as exc:
        return encode_json(name, {"refused": storable(f"the {name} could not be stored: {exc}")})


def _materialise(row: NewRow, pk: int, using: str | None = None) -> InboxMessage:
    """The row as the handler sees it, built without a query (as a query would build it)."""
    values = {
        "id": pk,
        "consumer": row.consumer,
        "message_id": row.message_id,
        "source": row.source,
        "event_type": row.event_type,
        "key": row.key,
        "payload": json.loads(row.payload),
        "headers": json.loads(row.headers),
        "status": row.status,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "history": json.loads(row.history),
        "received_at": row.processed_at,
        "updated_at": row.processed_at,
        "next_attempt_at": row.next_attempt_at,
        "locked_until": row.locked_until,
        "lease_id": row.lease_id,
        "processed_at": row.processed_at,
    }
    names = _field_names()
    return InboxMessage.from_db(using, names, [values[name] for name in names])


@functools.cache
def _field_names() -> list[str]:
    return [field.attname for field in InboxMessage._meta.concrete_fields]


def deliver(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
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
    row = _prepare(consumer, message_id, event_type, payload, headers, source, key)
    using = inbox_settings.database
    if interruptions.pending():
        give_back_interrupted(using)
    return _deliver_row(row, using, redelivered=redelivered)


def _deliver_row(
    row: NewRow, using: str, *, again: bool = True, redelivered: bool = False
) -> Outcome:
    handler = registry.get(row.consumer, row.event_type)
    if handler is None:
        outcome = _unhandled(row, using)
        return outcome if outcome is not None else _deliver_existing(row, using, again=again)
    if redelivered:
        return _deliver_redelivered(row, using)

    now = timezone.now()
    row.status, row.attempts, row.processed_at = Status.COMPLETED, 1, now
    pk: int | None = None
    message: InboxMessage | None = None
    started = time.perf_counter()
    try:
        with committing(using, lambda: [] if pk is None else [pk]):
            pk = insert_row(row, now, using)
            if pk is not None:
                message = _materialise(row, pk, using)
                run_handler(handler, message, using)
    except Exception as exc:
        if pk is None or connection_lost(exc, using):
            # Nothing is stored (the inbox's own insert failed, or the database went away):
            # the caller (a broker consumer, a webhook sender) delivers it again.
            raise
        duration = time.perf_counter() - started
        return _record_first_failure(row, exc, handler, using, duration)
    if message is None:
        return _deliver_existing(row, using, again=again)
    processed(message, time.perf_counter() - started, using)
    return Outcome.PROCESSED


def _deliver_redelivered(row: NewRow, using: str) -> Outcome:
    """A redelivery the inbox has no record of: count the lost attempt, then run durably."""
    now = timezone.now()
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
    insert_row(row, now, using)
    return _deliver_existing(row, using, again=False)


def _record_first_failure(
    row: NewRow, exc: Exception, handler: Handler, using: str, duration: float | None = None
) -> Outcome:
    """Store a new message whose first attempt failed (its own transaction)."""
    now = timezone.now()
    policy = RetryPolicy.for_handler(row.consumer, handler)
    status, delay = failure_outcome(exc, 1, policy)
    row.next_attempt_at = None if delay is None else now + timedelta(seconds=delay)
    entry = history.error_entry(
        exc, attempt=1, at=now, outcome=status, retry_at=row.next_attempt_at
    )
    row.status, row.attempts, row.processed_at = status, 1, None
    row.last_error = history.summary(entry)
    row.history = json.dumps([entry])
    pk = insert_row(row, now, using)
    if pk is None:
        # A concurrent delivery stored it while ours rolled back; report that one's state.
        return _deliver_existing(row, using, again=False)
    message = _materialise(row, pk, using)
    failure(message, entry, status, row.next_attempt_at, using=using, duration=duration)
    return Outcome(status)


def _current_status(row: NewRow, using: str) -> str | None:
    connection = connections[using]
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {quote('status')} FROM {quote(InboxMessage._meta.db_table)} "
            f"WHERE {quote('consumer')} = %s AND {quote('message_id')} = %s",
            [row.consumer, row.message_id],
        )
        found = cursor.fetchone()
    return None if found is None else str(found[0])


def _deliver_existing(row: NewRow, using: str, *, again: bool = True) -> Outcome:
    """The message's row exists: report it, or process it if it is due and free."""
    status = _current_status(row, using)
    if status == Status.COMPLETED:
        observe.event(
            "duplicate",
            consumer=row.consumer,
            message_id=row.message_id,
            event_type=row.event_type,
            using=using,
        )
        return Outcome.DUPLICATE
    if status in (Status.RECEIVED, Status.FAILED, Status.IN_PROGRESS):
        claimed = claim_batch(row.consumer, 1, using=using, message_id=row.message_id)
        if claimed:
            try:
                return process_claimed(claimed[0], using=using)
            except Exception as exc:
                if connection_lost(exc, using):
                    interruptions.note(claimed, using=using, running=claimed[0], error=exc)
                raise
        status = _current_status(row, using)
    if status is None:
        # Purged between our insert and our look: it is new again (once; then report it busy).
        if not again:
            return Outcome.IN_PROGRESS
        return _deliver_row(_fresh(row), using, again=False)
    return _STATUS_OUTCOMES[Status(status)]


def store(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
) -> bool:
    """Store one message for a worker to process later; return ``True`` if it was new.

    Takes the same arguments as :func:`deliver`. Use it to acknowledge a broker message as
    soon as the inbox holds it (ack-after-store); ``manage.py inbox_process`` or the Celery
    task then runs the handler. The row commits with the caller's transaction, if any.
    A message with no handler is stored ``dead`` with the reason (or refused, see
    ``INBOX_UNHANDLED``).
    """
    row = _prepare(consumer, message_id, event_type, payload, headers, source, key)
    using = inbox_settings.database
    if registry.get(row.consumer, row.event_type) is None:
        return _unhandled(row, using) is not None
    now = timezone.now()
    row.next_attempt_at = now
    return insert_row(row, now, using) is not None
