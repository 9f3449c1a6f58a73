"""The hot path's inserts: the insert that deduplicates (one message, or a batch already
completed) and a duplicate's status. Each is one round trip. The claim and the fenced
completion are in :mod:`.claiming`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import JSONField, Value

from ...models import InboxMessage
from .. import preparing, tombstones
from .common import (
    COLUMNS,
    JSON_COLUMNS,
    NewRow,
    Status,
    cached_sql,
    conflict_target,
    identity_index_changed,
    identity_params,
    identity_sql,
    quote_of,
    status_literal,
    table_of,
)

# --- insert: the unique key decides duplicates -------------------------------------------


def _literal(column: str, value: Any, vendor: str) -> str | None:
    """SQL for values that are the same for many rows, so they need no parameter."""
    if value is None:
        return "NULL"
    if column == "status":
        return status_literal(value)
    if column == "attempts":
        return str(int(value))
    if column in ("rerun", "skip_requested"):
        return "TRUE" if value else "FALSE"
    if value in ("", "[]", "{}") and column not in ("consumer", "message_id", "event_type"):
        cast = "::jsonb" if vendor == "postgresql" and column in JSON_COLUMNS else ""
        return f"'{value}'{cast}"
    return None


def _insert_sql(using: str, shape: tuple[str, ...], with_status: bool) -> str:
    def build(quote: Any, table: str) -> str:
        vendor = connections[using].vendor  # once per statement text, not per message
        insert = (
            f"INSERT INTO {table} ({', '.join(quote(c) for c in COLUMNS)}) "
            f"VALUES ({', '.join(shape)}) "
            f"ON CONFLICT {conflict_target(quote, vendor, using)} DO NOTHING "
            f"RETURNING {quote('id')}, {quote('status')}"
        )
        if not with_status:
            return insert
        return (
            f"WITH inserted AS ({insert}) SELECT {quote('id')}, {quote('status')} FROM inserted "
            "UNION ALL "
            f"SELECT NULL, {quote('status')} FROM {table} "
            f"WHERE {identity_sql(quote, 'postgresql')} AND NOT EXISTS (SELECT FROM inserted)"
        )

    return cached_sql(using, ("insert", shape, with_status), build)


def _shape(row: NewRow, now: datetime, connection: Any) -> tuple[tuple[str, ...], list[Any]]:
    """The VALUES of ``row`` and their parameters. Values that are the same for many rows
    (statuses, empty strings, NULLs) are written into the SQL, so only the message's own
    values travel as parameters and a few statement texts cover every row."""
    values = {**vars(row), "received_at": now, "updated_at": now}
    vendor = connection.vendor
    adapt = connection.ops.adapt_datetimefield_value
    placeholder = "%s::jsonb" if vendor == "postgresql" else "%s"
    shape: list[str] = []
    params: list[Any] = []
    for column in COLUMNS:
        value = values[column]
        literal = _literal(column, value, vendor)
        if literal is not None:
            shape.append(literal)
            continue
        shape.append(placeholder if column in JSON_COLUMNS else "%s")
        params.append(adapt(value) if isinstance(value, datetime) else value)
    return tuple(shape), params


def insert(row: NewRow, now: datetime, using: str) -> int | None:
    """``INSERT … ON CONFLICT (identity) DO NOTHING RETURNING id, status``: the new id,
    ``None`` for a duplicate. A late copy of a purged message goes in ``parked``
    (:mod:`~django_inbox.db.tombstones`): then ``row.status`` says so.

    MySQL and MariaDB insert plainly and take the pair's unique violation for a duplicate
    (:func:`_insert_plain`); other databases without ``ON CONFLICT`` do the same under a
    savepoint.
    """
    connection = connections[using]
    if connection.vendor == "mysql":
        return _insert_plain(row, now, using)[0]
    if connection.vendor not in ("postgresql", "sqlite"):
        return _insert_with_savepoint(row, now, using)
    shape, params = _shape(row, now, connection)
    with _inserting(using), preparing.cursor(using) as cursor:
        cursor.execute(_insert_sql(using, shape, False), params)
        found = cursor.fetchone()
    if found is None:
        return None
    return _inserted(row, int(found[0]), found[1], using)


def _inserted(row: NewRow, pk: int, status: str | None, using: str) -> int:
    """``pk``, the row just inserted; ``row.status`` becomes ``parked`` if it is a late copy
    (PostgreSQL's trigger parked it and said so in ``status``; elsewhere the tombstone is read
    now, and the row is parked by the caller in the same transaction)."""
    if connections[using].vendor == "postgresql":
        if status is not None and status != row.status:
            row.status = Status(status)
    elif tombstones.is_late(row, using):
        row.status = Status.PARKED  # intake.late.record parks it, in the insert's transaction
    return pk


def insert_or_status(row: NewRow, now: datetime, using: str) -> tuple[int | None, str | None]:
    """Insert ``row`` unless ``(consumer, message_id)`` exists: ``(new id, None)``, or
    ``(None, status of the existing row)``.

    On PostgreSQL one statement does both, so a duplicate costs one round trip: ``WITH
    inserted AS (INSERT … ON CONFLICT DO NOTHING RETURNING id)`` and, when nothing was
    inserted, the existing row's status. The status can be ``None`` there too: a row
    committed by a concurrent transaction after this statement's snapshot was taken is not
    visible to it (ask :func:`current_status` then). MySQL and MariaDB read it after a refused
    insert (:func:`_insert_plain`); other databases ask separately.
    """
    connection = connections[using]
    if connection.vendor == "mysql":
        return _insert_plain(row, now, using)
    if connection.vendor != "postgresql":
        pk = insert(row, now, using)
        return (pk, None) if pk is not None else (None, current_status(*_key(row), using))
    shape, params = _shape(row, now, connection)
    with _inserting(using), preparing.cursor(using) as cursor:
        cursor.execute(_insert_sql(using, shape, True), [*params, *identity_params(*_key(row))])
        found = cursor.fetchone()
    if found is None:
        return None, None  # committed after our snapshot: see the docstring
    pk, status = found
    if pk is None:
        return None, str(status)
    return _inserted(row, int(pk), status, using), None


@contextmanager
def _inserting(using: str) -> Iterator[None]:
    """An insert whose failure may say that the identity index changed under this process:
    then :class:`~.common.IdentityIndexChanged` is raised instead (see
    :func:`~.common.identity_index_changed`)."""
    try:
        yield
    except DatabaseError as exc:
        identity_index_changed(exc, using)
        raise


def _key(row: NewRow) -> tuple[str, str]:
    return row.consumer, row.message_id


def _insert_plain(row: NewRow, now: datetime, using: str) -> tuple[int | None, str | None]:
    """MySQL and MariaDB: one ``INSERT``; ``(new id, None)``, or ``(None, status)`` of the
    pair's existing row.

    There a failed statement is undone alone and the transaction goes on, so no savepoint is
    needed around it (Django's ``save()`` would mark the transaction for rollback): a new
    message costs the insert, a duplicate the insert and one read. A unique violation is a
    duplicate only if the pair has a row (:func:`_pair_status`); another unique index or a
    check refused the row otherwise, and the error is raised.
    """
    connection = connections[using]
    shape, params = _shape(row, now, connection)

    def build(quote: Any, table: str) -> str:
        columns = ", ".join(quote(column) for column in COLUMNS)
        return f"INSERT INTO {table} ({columns}) VALUES ({', '.join(shape)})"

    sql = cached_sql(using, ("insert-plain", shape), build)
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            pk = int(cursor.lastrowid)
    except IntegrityError:
        status = _pair_status(row, using)
        if status is None:
            raise  # another constraint refused the row: not a duplicate, never acknowledged
        return None, status
    return _inserted(row, pk, None, using), None


def _insert_with_savepoint(row: NewRow, now: datetime, using: str) -> int | None:
    fields: dict[str, Any] = {**vars(row), "received_at": now, "updated_at": now}
    for name in JSON_COLUMNS:
        value = json.loads(fields[name])
        # JSON's null, not SQL's NULL (which the NOT NULL column refuses): as PostgreSQL's
        # statement stores it.
        fields[name] = Value(None, output_field=JSONField()) if value is None else value
    try:
        with transaction.atomic(using=using):
            message = InboxMessage(**fields)
            message.save(using=using, force_insert=True)
    except IntegrityError:
        if _pair_status(row, using) is None:
            raise  # another constraint refused the row: not a duplicate, never acknowledged
        return None
    return _inserted(row, int(message.pk), None, using)


def _pair_status(row: NewRow, using: str) -> str | None:
    """The status of ``(consumer, message_id)``'s row, ``None`` without one: what alone makes
    an insert's ``IntegrityError`` a duplicate (a user's unique index, or MariaDB's check of a
    JSON column, refuses rows too). A locking read, so that it sees the row a concurrent
    transaction just committed (a plain read in ``REPEATABLE READ`` keeps its snapshot); a
    shared one, so that two transactions answering the same duplicate never wait for each
    other."""
    connection = connections[using]
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {quote('status')} FROM {quote(InboxMessage._meta.db_table)} "
            f"WHERE {quote('consumer')} = %s AND {quote('message_id')} = %s"
            + (" LOCK IN SHARE MODE" if connection.vendor == "mysql" else ""),
            [row.consumer, row.message_id],
        )
        found = cursor.fetchone()
    return None if found is None else str(found[0])


def insert_completed(rows: list[NewRow], now: datetime, using: str) -> dict[tuple[str, str], int]:
    """Insert messages as ``completed`` (attempt 1) in one statement; return the new ids by
    ``(consumer, message_id)``, for the rows that were new only. A late copy of a purged
    message goes in ``parked``: its row's ``status`` says so.

    Rows go in ``message_id`` order, so two transactions inserting overlapping batches take the
    unique index's locks in the same order and cannot deadlock on them.
    """
    connection = connections[using]
    vendor = connection.vendor
    if vendor not in ("postgresql", "sqlite"):
        found = {}
        for row in rows:
            pk = insert(row, now, using)
            if pk is not None:
                found[(row.consumer, row.message_id)] = pk
        return found
    unique = {(row.consumer, row.message_id): row for row in rows}
    ordered = [unique[key] for key in sorted(unique)]
    quote = quote_of(using)
    json_param = "%s::jsonb" if vendor == "postgresql" else "%s"
    constant = {
        "status": status_literal(Status.COMPLETED),
        "attempts": "1",
        "last_error": "''",
        "history": _literal("history", "[]", vendor),
        "next_attempt_at": "NULL",
        "locked_until": "NULL",
        "lease_id": "''",
        "rerun": "FALSE",
        "skip_requested": "FALSE",
    }
    shape = ", ".join(
        constant.get(column) or (json_param if column in JSON_COLUMNS else "%s")
        for column in COLUMNS
    )
    stamp = connection.ops.adapt_datetimefield_value(now)
    params: list[Any] = []
    for row in ordered:
        params += [row.consumer, row.message_id, row.source, row.event_type, row.key, row.sequence]
        params += [row.payload, row.headers, stamp, stamp, stamp]
    sql = (
        f"INSERT INTO {table_of(using)} ({', '.join(quote(c) for c in COLUMNS)}) VALUES "
        + ", ".join(f"({shape})" for _ in ordered)
        + f" ON CONFLICT {conflict_target(quote, vendor, using)} DO NOTHING "
        f"RETURNING {quote('consumer')}, {quote('message_id')}, {quote('id')}, {quote('status')}"
    )
    with _inserting(using), connection.cursor() as cursor:
        cursor.execute(sql, params)
        found = cursor.fetchall()
    return {
        (consumer, message_id): _inserted(unique[(consumer, message_id)], int(pk), status, using)
        for consumer, message_id, pk, status in found
    }


def current_status_sql(using: str) -> str:
    """The status of one message, by the unique key (one index probe)."""
    vendor = connections[using].vendor
    return cached_sql(
        using,
        "current_status",
        lambda quote, table: (
            f"SELECT {quote('status')} FROM {table} WHERE {identity_sql(quote, vendor)}"
        ),
    )


def current_status(consumer: str, message_id: str, using: str) -> str | None:
    """The status of ``(consumer, message_id)``, ``None`` if it has no row."""
    with preparing.cursor(using) as cursor:
        params = identity_params(consumer, message_id, connections[using].vendor)
        cursor.execute(current_status_sql(using), params)
        found = cursor.fetchone()
    return None if found is None else str(found[0])
