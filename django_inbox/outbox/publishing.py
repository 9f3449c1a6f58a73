"""``publish()``: a message written in the caller's transaction, for a relay to send."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from django.db import connections, transaction

from .. import clock, tracing
from ..conf import inbox_settings
from ..db import on_commit, preparing
from ..exceptions import InvalidField, InvalidPayload, PayloadTooLarge
from ..intake.validation import clean_text, encode_json
from ..side_effects import current_message, side_effect
from . import headers as amqp_headers
from .headers import HEADERS_MAX_BYTES as HEADERS_MAX_BYTES
from .headers import SHORT_MAX_BYTES
from .headers import TRACE_HEADERS as TRACE_HEADERS
from .held import holds_rows

#: Headers the outbox sets on each publication (a caller's own headers keep other names).
CAUSATION_CONSUMER = "x-causation-consumer"
CAUSATION_ID = "x-causation-id"


@side_effect(name="django_inbox.outbox.publish")
def publish(
    event_type: str,
    payload: Any,
    *,
    routing_key: str,
    key: str = "",
    headers: Mapping[str, Any] | None = None,
    exchange: str = "",
) -> str | None:
    """Write a message to the outbox in the current transaction (at once outside one) and
    return its message id, the AMQP ``message_id`` of every publication of it.

    Validated as ``deliver()`` validates (JSON, size, NUL): a bad message raises a
    ``ValueError`` subclass and nothing is written. Rolled back with the caller's work, it is
    never published. Called from an inbox handler, the row records that message as its cause
    (and passes on its trace headers). A ``@side_effect``: during a re-run of a completed
    message whose consumer suppresses side effects, nothing is written and ``None`` is
    returned.
    """

    event_type = _short("event_type", clean_text("event_type", event_type, required=True))
    routing_key = _short("routing_key", clean_text("routing_key", routing_key, required=False))
    exchange = _short("exchange", clean_text("exchange", exchange, required=False))
    key = clean_text("key", key, required=False)
    if not exchange and not routing_key:
        raise InvalidField("routing_key is empty: the default exchange routes by queue name")
    if headers is not None and not isinstance(headers, Mapping):
        raise InvalidPayload(f"headers must be a mapping, got {type(headers).__name__}")
    limit = inbox_settings.max_payload_bytes
    body = encode_json("payload", payload, max_bytes=limit)
    sent_headers = amqp_headers.own(headers or {})
    cause = current_message()
    consumer = cause_id = ""
    encoded_headers = None
    # W3C's headers of the current span (OpenTelemetry), else the causing message's; its
    # other trace headers (baggage, B3) as they came.
    trace = tracing.current_headers(sent_headers)
    if cause is not None:
        consumer, cause_id = cause.consumer, cause.message_id
        sent_headers.setdefault(CAUSATION_CONSUMER, consumer)
        sent_headers.setdefault(CAUSATION_ID, cause_id)
        carried = amqp_headers.carried(cause.headers, sent_headers)
        if trace:
            carried = {k: v for k, v in carried.items() if k not in tracing.TRACE_HEADERS}
        trace = {**carried, **trace}
    if trace:
        try:
            encoded_headers = amqp_headers.encode({**sent_headers, **trace})
        except PayloadTooLarge:  # the caller's own headers come first
            for name in trace:
                amqp_headers.dropped(name, "with it the headers would pass their limit")
    if encoded_headers is None:
        encoded_headers = amqp_headers.encode(sent_headers)
    message_id = str(uuid.uuid4())
    _insert(
        [message_id, event_type, body, encoded_headers, exchange, routing_key, key],
        [consumer, cause_id],
        inbox_settings.database,
    )
    return message_id


def _short(name: str, value: str) -> str:
    """``value``, unless AMQP cannot carry it as a short string (over 255 bytes of UTF-8)."""
    if len(value.encode("utf-8")) > SHORT_MAX_BYTES:
        raise InvalidField(
            f"{name} is {len(value.encode('utf-8'))} bytes of UTF-8; AMQP allows {SHORT_MAX_BYTES}"
        )
    return value


#: Columns ``publish()`` writes, in the order of its statement.
_COLUMNS = (
    "message_id",
    "event_type",
    "payload",
    "headers",
    "exchange",
    "routing_key",
    "key",
    "status",
    "attempts",
    "last_error",
    "created_at",
    "updated_at",
    "next_attempt_at",
    "lease_id",
    "causation_consumer",
    "causation_message_id",
)
_sql: dict[tuple[str, str], str] = {}


def _insert(values: list[Any], cause: list[str], using: str) -> None:
    """One ``INSERT`` with the JSON already encoded (prepared on PostgreSQL, as the inbox's
    own statements are).

    A row whose key already has a pending row is written held (no due time): relays' claims
    never read it, and the relay that settles the earlier row makes it due. If that relay
    settled it while this transaction was still open, its release could not see this row: so
    once this transaction commits, a held row is released here too if nothing holds it back
    any more. (Had the caller's process died in between, a relay's sweep releases it.)

    On PostgreSQL that release is left out when this transaction wrote the row that holds this
    one (a handler publishing several events of one order): no relay can settle a row before
    the transaction writing it commits, and the relay that settles it then sees this row. The
    ``RETURNING`` clause says so when the holding row's ``xmin`` is the new row's (the same
    transaction id; any PostgreSQL version). Rows written in a savepoint have a transaction id
    of their own: a row held behind one, or written in one behind the transaction's earlier
    row, is released after the commit, as before.
    """
    from .models import OutboxMessage

    connection = connections[using]
    holds = holds_rows(using)
    returns = holds and connection.features.can_return_columns_from_insert
    sql = _sql.get((using, connection.vendor))
    if sql is None:
        quote = connection.ops.quote_name
        table = quote(OutboxMessage._meta.db_table)
        json = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
        # The first entry of the key index from the key on (``held.first_of_key`` says why):
        # the key's oldest pending row, if it is this key's (``head.key = %s``).
        key = quote("key")
        xmin = ", e.xmin" if connection.vendor == "postgresql" else ""
        head = (
            f"(SELECT e.{key}{xmin} FROM {table} e WHERE e.{quote('status')} = 'pending' "
            f"AND e.{key} <> '' AND e.{key} >= %s ORDER BY e.{key}, e.{quote('id')} LIMIT 1) "
            f"head WHERE head.{key} = %s"
        )
        due = (
            f"CASE WHEN %s = '' OR NOT EXISTS (SELECT 1 FROM {head}) THEN %s END" if holds else "%s"
        )
        returned = f"{quote('next_attempt_at')} IS NULL"
        if connection.vendor == "postgresql":
            # Held, and not by a row this transaction wrote (see above).
            returned = (
                f"CASE WHEN {returned} THEN NOT EXISTS (SELECT 1 FROM {head} "
                f"AND head.xmin = {table}.xmin) END"
            )
        sql = _sql[(using, connection.vendor)] = (
            f"INSERT INTO {table} ({', '.join(quote(column) for column in _COLUMNS)}) "
            f"VALUES (%s, %s, {json}, {json}, %s, %s, %s, 'pending', 0, '', %s, %s, {due}, '', "
            "%s, %s)" + (f" RETURNING {returned}" if returns else "")
        )
    stamp = connection.ops.adapt_datetimefield_value(clock.now())
    key = values[-1]
    due_params = [key, key, key, stamp] if holds else [stamp]
    held_params = [key, key] if connection.vendor == "postgresql" else []
    with preparing.cursor(using) as cursor:
        cursor.execute(sql, [*values, stamp, stamp, *due_params, *cause, *held_params])
        held = bool(cursor.fetchone()[0]) if returns else bool(key and holds)
    if held:
        _release_on_commit(key, using)


class _Release:
    """The keys of the rows a transaction wrote held, released once it commits (one statement
    for them all)."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.keys: set[str] = set()

    def __call__(self) -> None:
        from .held import release

        release(self.keys, self.using)


def _release_on_commit(key: str, using: str) -> None:
    """Release ``key``'s held row once the caller's transaction commits: added to the
    transaction's pending release if it has one (a handler publishing several events of one
    order), else a new one. At once outside a transaction."""
    callbacks = on_commit.pending(using)
    if connections[using].in_atomic_block and callbacks is not None:
        for entry in callbacks:
            callback = on_commit.callback_of(entry)
            if isinstance(callback, _Release) and callback.using == using:
                callback.keys.add(key)
                return
    batch = _Release(using)
    batch.keys.add(key)
    transaction.on_commit(batch, using=using, robust=True)
