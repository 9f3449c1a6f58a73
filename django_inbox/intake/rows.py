"""A message on its way into the table: validated into a :class:`NewRow`, inserted, and shown
to its handler as an :class:`~django_inbox.models.InboxMessage` without reading it back."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar, Unpack

from django.db import connections, transaction

from .. import events
from ..conf import inbox_settings
from ..db import statements
from ..db.statements import NewRow
from ..exceptions import InvalidPayload
from ..models import InboxMessage
from ..text import storable_json
from . import late
from .message import MessageFields
from .validation import CONSUMER_MAX, clean_message_id, clean_sequence, clean_text, encode_json

__all__ = [
    "NewRow",
    "append_history",
    "fresh",
    "insert",
    "insert_completed",
    "insert_or_status",
    "materialise",
    "once_more_if_index_changed",
    "prepare",
]

T = TypeVar("T")
Status = InboxMessage.Status


def prepare(**message: Unpack[MessageFields]) -> NewRow:
    """Validate a message (``deliver()``'s keyword arguments) into a :class:`NewRow`; raise
    an :class:`~django_inbox.InvalidMessage` subclass for bad input."""
    headers = message.get("headers")
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidPayload(f"headers must be a mapping, got {type(headers).__name__}")
    max_bytes = inbox_settings.max_payload_bytes
    try:
        # Headers are what a broker or sender added: their text is made storable, not refused.
        cleaned_headers = storable_json(dict(headers or {}))
    except RecursionError:
        raise InvalidPayload(
            f"headers are nested more than {inbox_settings.max_json_depth} levels deep; "
            "INBOX_MAX_JSON_DEPTH allows " + str(inbox_settings.max_json_depth)
        ) from None
    return NewRow(
        consumer=clean_text(
            "consumer", message["consumer"], required=True, max_length=CONSUMER_MAX
        ),
        message_id=clean_message_id(message["message_id"]),
        event_type=clean_text("event_type", message["event_type"], required=True),
        source=clean_text("source", message.get("source", ""), required=False),
        key=clean_text("key", message.get("key", ""), required=False),
        sequence=clean_sequence(message.get("sequence")),
        payload=encode_json("payload", message["payload"], max_bytes=max_bytes),
        headers=encode_json("headers", cleaned_headers, max_bytes=max_bytes),
    )


def once_more_if_index_changed(using: str, call: Callable[[], T]) -> T:
    """``call()``, sent once more if the inbox's identity index changed under this process
    (:class:`~django_inbox.db.statements.IdentityIndexChanged`: nothing was committed, and the
    statements are built again). Only outside the caller's own transaction: inside it, the
    transaction is lost, and the error goes to the caller, whose sender delivers again."""
    try:
        return call()
    except statements.IdentityIndexChanged:
        if connections[using].in_atomic_block:
            raise
        return call()


def fresh(row: NewRow) -> NewRow:
    """The message as it arrived, without any state a delivery attempt put on it."""
    return NewRow(
        consumer=row.consumer,
        message_id=row.message_id,
        event_type=row.event_type,
        payload=row.payload,
        headers=row.headers,
        source=row.source,
        key=row.key,
        sequence=row.sequence,
    )


def insert(row: NewRow, now: datetime, using: str) -> int | None:
    """Insert ``row``; return its new id, or ``None`` if ``(consumer, message_id)`` exists.
    A late copy of a purged message goes in ``parked`` with its reason: ``row.status`` is
    then ``parked`` (:mod:`.late`)."""
    intended = row.status
    with _parking_atomically(using):
        pk = statements.insert(row, now, using)
        if pk is not None and late.is_late(row, intended):
            late.record(row, pk, using)
    if pk is not None:
        _received(row, pk, using)
    return pk


def insert_or_status(row: NewRow, now: datetime, using: str) -> tuple[int | None, str | None]:
    """Insert ``row``: ``(new id, None)``, or ``(None, the existing row's status)`` (``None``
    when the existing row was committed too recently to be seen, or is gone again). A late
    copy goes in ``parked``, as with :func:`insert`."""
    intended = row.status
    with _parking_atomically(using):
        pk, status = statements.insert_or_status(row, now, using)
        if pk is not None and late.is_late(row, intended):
            late.record(row, pk, using)
    if pk is not None:
        _received(row, pk, using)
    return pk, status


def _parking_atomically(using: str) -> Any:
    """Off PostgreSQL and outside the caller's transaction, a transaction around an insert and
    the parking of a late copy, so that no worker claims the row in between (PostgreSQL's
    trigger parks it inside the insert)."""
    connection = connections[using]
    if connection.vendor == "postgresql" or connection.in_atomic_block:
        return contextlib.nullcontext()
    return transaction.atomic(using=using)


class LateCopies(Exception):
    """A batch held late copies of purged messages: delivered one by one, each is parked."""


def insert_completed(rows: list[NewRow], now: datetime, using: str) -> dict[tuple[str, str], int]:
    """Insert messages as ``completed`` (attempt 1) in one statement; return the new ids.
    Raise :class:`LateCopies` if any went in as a late copy (the caller rolls back)."""
    new = statements.insert_completed(rows, now, using)
    by_key = {(row.consumer, row.message_id): row for row in rows}
    if any(by_key[key].status == Status.PARKED for key in new):
        raise LateCopies()
    for key, pk in new.items():
        _received(by_key[key], pk, using)
    return new


def _received(row: NewRow, pk: int, using: str) -> None:
    events.event("received", **events.about(row, using, pk=pk, attempt=0))


def materialise(row: NewRow, pk: int, using: str | None = None) -> InboxMessage:
    """The row as the handler sees it, built without a query (as a query would build it)."""
    values = {
        **vars(row),
        "id": pk,
        "payload": json.loads(row.payload),
        "headers": json.loads(row.headers),
        "history": json.loads(row.history),
        "received_at": row.processed_at,
        "updated_at": row.processed_at,
    }
    names = _field_names()
    return InboxMessage.from_db(using, names, [values[name] for name in names])


@functools.cache
def _field_names() -> list[str]:
    return [field.attname for field in InboxMessage._meta.concrete_fields]


def append_history(pk: int, entries: list[dict[str, Any]], using: str) -> None:
    """Append ``entries`` to row ``pk``'s history as it is now, under the row's lock: for
    entries written outside the transaction that read the row, so that whatever another
    writer added meanwhile is kept."""
    from django.db import transaction

    from .. import history

    if not entries:
        return
    with transaction.atomic(using=using):
        found = (
            InboxMessage.objects.using(using)
            .select_for_update()
            .filter(pk=pk)
            .values_list("history", flat=True)
            .first()
        )
        if found is None:
            return  # purged meanwhile
        kept = found
        for entry in entries:
            kept = history.append(kept, entry)
        InboxMessage.objects.using(using).filter(pk=pk).update(history=kept)
