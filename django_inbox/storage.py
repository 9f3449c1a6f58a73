"""The few hot-path statements, written as SQL so each costs one round trip.

Everything else goes through the ORM. The unique constraint on ``(consumer, message_id)``
decides duplicates: ``INSERT … ON CONFLICT DO NOTHING`` on PostgreSQL and SQLite, an insert
under a savepoint elsewhere. A conflict is the mechanism, never an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction

from . import observe
from .models import InboxMessage

_COLUMNS = (
    "consumer",
    "message_id",
    "source",
    "event_type",
    "key",
    "payload",
    "headers",
    "status",
    "attempts",
    "last_error",
    "history",
    "received_at",
    "updated_at",
    "next_attempt_at",
    "locked_until",
    "lease_id",
    "processed_at",
)
_JSON_COLUMNS = {"payload", "headers", "history"}
_sql_cache: dict[tuple[Any, ...], str] = {}


@dataclass
class NewRow:
    """A validated message, ready to insert. JSON fields hold encoded text."""

    consumer: str
    message_id: str
    event_type: str
    payload: str
    headers: str = "{}"
    source: str = ""
    key: str = ""
    status: str = InboxMessage.Status.RECEIVED
    attempts: int = 0
    last_error: str = ""
    history: str = "[]"
    next_attempt_at: datetime | None = None
    locked_until: datetime | None = None
    lease_id: str = ""
    processed_at: datetime | None = None


def _table(using: str) -> str:
    return connections[using].ops.quote_name(InboxMessage._meta.db_table)


def _literal(column: str, value: Any, vendor: str) -> str | None:
    """SQL for values that are the same for many rows, so they need no parameter."""
    if value is None:
        return "NULL"
    if column == "status":
        return f"'{InboxMessage.Status(value).value}'"
    if column == "attempts":
        return str(int(value))
    if value in ("", "[]", "{}") and column not in ("consumer", "message_id", "event_type"):
        cast = "::jsonb" if vendor == "postgresql" and column in _JSON_COLUMNS else ""
        return f"'{value}'{cast}"
    return None


def _insert_sql(using: str, shape: tuple[str, ...]) -> str:
    connection = connections[using]
    key = (using, connection.vendor, shape)
    sql = _sql_cache.get(key)
    if sql is not None:
        return sql
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {_table(using)} ({', '.join(quote(c) for c in _COLUMNS)}) "
        f"VALUES ({', '.join(shape)}) "
        f"ON CONFLICT ({quote('consumer')}, {quote('message_id')}) DO NOTHING "
        f"RETURNING {quote('id')}"
    )
    _sql_cache[key] = sql
    return sql


def insert_row(row: NewRow, now: datetime, using: str) -> int | None:
    """Insert ``row``; return its new id, or ``None`` if ``(consumer, message_id)`` exists.

    Values that are the same for many rows (statuses, empty strings, NULLs) are written into
    the SQL, so only the message's own values travel as parameters.
    """
    connection = connections[using]
    values: dict[str, Any] = {
        "consumer": row.consumer,
        "message_id": row.message_id,
        "source": row.source,
        "event_type": row.event_type,
        "key": row.key,
        "payload": row.payload,
        "headers": row.headers,
        "status": row.status,
        "attempts": row.attempts,
        "last_error": row.last_error,
        "history": row.history,
        "received_at": now,
        "updated_at": now,
        "next_attempt_at": row.next_attempt_at,
        "locked_until": row.locked_until,
        "lease_id": row.lease_id,
        "processed_at": row.processed_at,
    }
    vendor = connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        return _insert_with_savepoint(row, values, using)
    adapt = connection.ops.adapt_datetimefield_value
    placeholder = "%s::jsonb" if vendor == "postgresql" else "%s"
    shape: list[str] = []
    params: list[Any] = []
    for column in _COLUMNS:
        value = values[column]
        literal = _literal(column, value, vendor)
        if literal is not None:
            shape.append(literal)
            continue
        shape.append(placeholder if column in _JSON_COLUMNS else "%s")
        params.append(adapt(value) if isinstance(value, datetime) else value)
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql(using, tuple(shape)), params)
        found = cursor.fetchone()
    if found is None:
        return None
    _received(row, int(found[0]), using)
    return int(found[0])


def _received(row: NewRow, pk: int, using: str) -> None:
    observe.event(
        "received",
        consumer=row.consumer,
        message_id=row.message_id,
        event_type=row.event_type,
        pk=pk,
        using=using,
    )


def insert_completed_rows(
    rows: list[NewRow], now: datetime, using: str
) -> dict[tuple[str, str], int]:
    """Insert messages as ``completed`` (attempt 1) in one statement; return the new ids.

    The returned mapping is keyed by ``(consumer, message_id)`` and holds only the rows that
    were new. Rows go in ``message_id`` order, so two transactions inserting overlapping
    batches take the unique index's locks in the same order and cannot deadlock on them.
    """
    connection = connections[using]
    vendor = connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        found = {}
        for row in rows:
            pk = insert_row(row, now, using)
            if pk is not None:
                found[(row.consumer, row.message_id)] = pk
        return found
    unique = {(row.consumer, row.message_id): row for row in rows}
    ordered = [unique[key] for key in sorted(unique)]
    quote = connection.ops.quote_name
    json_param = "%s::jsonb" if vendor == "postgresql" else "%s"
    constant = {
        "status": _literal("status", InboxMessage.Status.COMPLETED, vendor),
        "attempts": "1",
        "last_error": "''",
        "history": _literal("history", "[]", vendor),
        "next_attempt_at": "NULL",
        "locked_until": "NULL",
        "lease_id": "''",
    }
    shape = ", ".join(
        constant.get(column) or (json_param if column in _JSON_COLUMNS else "%s")
        for column in _COLUMNS
    )
    stamp = connection.ops.adapt_datetimefield_value(now)
    params: list[Any] = []
    for row in ordered:
        params += [row.consumer, row.message_id, row.source, row.event_type, row.key]
        params += [row.payload, row.headers, stamp, stamp, stamp]
    sql = (
        f"INSERT INTO {_table(using)} ({', '.join(quote(c) for c in _COLUMNS)}) VALUES "
        + ", ".join(f"({shape})" for _ in ordered)
        + f" ON CONFLICT ({quote('consumer')}, {quote('message_id')}) DO NOTHING "
        f"RETURNING {quote('consumer')}, {quote('message_id')}, {quote('id')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        new = {(consumer, message_id): int(pk) for consumer, message_id, pk in cursor.fetchall()}
    for key, pk in new.items():
        _received(unique[key], pk, using)
    return new


def _insert_with_savepoint(row: NewRow, values: dict[str, Any], using: str) -> int | None:
    fields = dict(values)
    for name in _JSON_COLUMNS:
        fields[name] = json.loads(fields[name])
    try:
        with transaction.atomic(using=using):
            message = InboxMessage(**fields)
            message.save(using=using, force_insert=True)
    except IntegrityError:
        return None
    _received(row, message.pk, using)
    return message.pk


_PQ_TRANSACTION_INERROR = 3  # the same value in psycopg 3 and psycopg2


def transaction_aborted(using: str) -> bool:
    """Whether the current transaction can no longer commit (checked without a round trip)."""
    connection = connections[using]
    if connection.needs_rollback:
        return True
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    raw = connection.connection
    info = getattr(raw, "info", None)
    status = info.transaction_status if info is not None else raw.get_transaction_status()
    return int(status) == _PQ_TRANSACTION_INERROR


def complete_row(pk: int, lease_id: str, now: datetime, using: str) -> bool:
    """Mark a claimed row completed if ``lease_id`` still holds it (the fence)."""
    connection = connections[using]
    quote = connection.ops.quote_name
    sql = _sql_cache.get((using, "complete"))
    if sql is None:
        sql = (
            f"UPDATE {_table(using)} SET {quote('status')} = %s, {quote('processed_at')} = %s, "
            f"{quote('updated_at')} = %s, {quote('locked_until')} = NULL, "
            f"{quote('next_attempt_at')} = NULL, {quote('lease_id')} = '', "
            f"{quote('last_error')} = '' "
            f"WHERE {quote('id')} = %s AND {quote('lease_id')} = %s "
            f"AND {quote('status')} = %s"
        )
        _sql_cache[(using, "complete")] = sql
    stamp = connection.ops.adapt_datetimefield_value(now)
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            [
                InboxMessage.Status.COMPLETED.value,
                stamp,
                stamp,
                pk,
                lease_id,
                InboxMessage.Status.IN_PROGRESS.value,
            ],
        )
        return bool(cursor.rowcount == 1)
