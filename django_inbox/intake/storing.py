"""``store()`` and ``store_dead()``: a message kept for a worker, or kept ``dead`` for an
operator. Neither runs a handler."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .. import clock, events, history
from ..conf import inbox_settings
from ..exceptions import InvalidMessage, Reject, UnknownConsumer, UnknownEventType
from ..models import InboxMessage
from ..outcomes import Outcome
from ..processing.attempts import no_handler_reason
from ..registry import registry
from ..text import cut, storable, storable_json
from . import late, rows
from .rows import NewRow
from .validation import (
    CONSUMER_MAX,
    TEXT_MAX,
    clean_message_id,
    clean_sequence,
    clean_text,
    encode_json,
)

Status = InboxMessage.Status
#: The error type of a message kept dead without the key it named (one that could not be read,
#: or stored as it is): an operator's replay of it is refused in an ordered consumer, where it
#: would run outside its key's order.
KEY_LOST = "KeyLost"


def store(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
    sequence: int | None = None,
) -> bool:
    """Store one message for a worker to process later; return ``True`` if it was new.

    Takes the same arguments as :func:`~django_inbox.deliver`. Use it to acknowledge a broker
    message as soon as the inbox holds it (ack-after-store); ``manage.py inbox_process`` or the
    Celery task then runs the handler. The row commits with the caller's transaction, if any.
    A message with no handler is stored ``dead`` with the reason (or refused, see
    ``INBOX_UNHANDLED``); a consumer without any handler is refused (``UnknownConsumer``).
    """
    row = rows.prepare(
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

    def insert() -> bool:
        if registry.get(row.consumer, row.event_type) is None:
            return unhandled(row, using) is not None
        now = clock.now()
        row.next_attempt_at = now
        pk = rows.insert(row, now, using)
        if pk is not None and row.status == Status.PARKED:
            late.report(row, pk, using)  # a late copy of a purged message
        return pk is not None

    return rows.once_more_if_index_changed(using, insert)


def unhandled(row: NewRow, using: str) -> Outcome | None:
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
    sequence: Any = None,
) -> bool:
    """Keep a message that can never be handled as ``dead``, with the reason; ``True`` if new.

    For what a consumer cannot even decode (a body that is not JSON, an unsupported content
    type, a payload over the size limit): the message is kept where an operator sees it,
    instead of being dropped or retried in a loop. ``payload`` should be what is left of it
    (e.g. the raw body). Takes the other arguments of :func:`~django_inbox.deliver`.

    Being the last resort, it stores what it can: text fields are made storable, an event
    type too long for its column is cut (marked with an ellipsis), a ``key`` or ``source`` that
    cannot be stored as it is (too long, a NUL) is left blank (cut or cleaned, two keys could
    become one; the reason and the headers say what arrived; a blanked key makes the error
    type :data:`KEY_LOST`), and headers or a payload that cannot be stored are replaced by a
    note saying why. Only an unusable ``consumer`` or ``message_id`` raises
    :class:`~django_inbox.InvalidMessage`: without them there is no row to keep.
    """
    max_bytes = inbox_settings.max_payload_bytes
    kept_key = _whole_or_blank(key)
    if key and not kept_key:
        error_type = KEY_LOST
    row = NewRow(
        consumer=clean_text("consumer", consumer, required=True, max_length=CONSUMER_MAX),
        message_id=clean_message_id(message_id),
        event_type=cut(storable(event_type or "unknown"), TEXT_MAX),
        source=_short_or_blank(storable(source or "")),
        key=kept_key,
        sequence=_sequence_or_none(sequence),
        payload=_encode_or_note("payload", payload, max_bytes),
        headers=_encode_or_note(
            "headers", dict(headers) if isinstance(headers, Mapping) else {}, max_bytes
        ),
    )
    return _insert_dead(row, reason, error_type, inbox_settings.database)


def _whole_or_blank(value: str | None) -> str:
    """``value`` if it can be stored as it is, else blank: made storable or cut, two keys (or
    sources) could become one."""
    try:
        return clean_text("key", value, required=False)
    except InvalidMessage:
        return ""


def _short_or_blank(text: str) -> str:
    return text if len(text) <= TEXT_MAX else ""


def _sequence_or_none(value: Any) -> int | None:
    try:
        return clean_sequence(value)
    except InvalidMessage:
        return None  # a dead letter keeps what it can; the reason says what was wrong


def _encode_or_note(name: str, value: Any, max_bytes: int) -> str:
    try:
        return encode_json(name, storable_json(value), max_bytes=max_bytes)
    except InvalidMessage as exc:
        return encode_json(name, {"refused": storable(f"the {name} could not be stored: {exc}")})


def _insert_dead(row: NewRow, reason: str, error_type: str, using: str) -> bool:
    now = clock.now()
    entry = history.error_entry(
        Reject(reason), attempt=0, at=now, outcome=Status.DEAD, error_type=error_type
    )
    row.status = Status.DEAD
    row.last_error = history.summary(entry)
    row.history = json.dumps([entry])
    pk = rows.insert(row, now, using)
    if pk is None:
        return False
    events.event(
        "dead", **events.about(row, using, pk=pk), error_type=error_type, detail="stored dead"
    )
    return True
