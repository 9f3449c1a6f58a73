"""The hot path's lease: the claim of due rows (or of one message by its id) and the fenced
completion. Each is one round trip."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections

from ...models import ATTEMPTS_MAX, InboxMessage
from .. import preparing
from .common import (
    JSON_COLUMNS,
    Status,
    cached_sql,
    fence,
    identity_params,
    identity_sql,
    status_aside,
    status_literal,
)


def _claim_sql(quote: Any, table: str, where: str) -> str:
    """``UPDATE`` the rows ``where`` selects to ``in_progress`` under a new lease, the attempt
    counted, ``RETURNING`` every column. Parameters: lease id, lease expiry (twice), now, then
    those of ``where``."""
    names = [quote(field.attname) for field in InboxMessage._meta.concrete_fields]
    return (
        f"UPDATE {table} SET {quote('status')} = {status_literal(Status.IN_PROGRESS)}, "
        f"{quote('attempts')} = LEAST({quote('attempts')}, {ATTEMPTS_MAX - 1}) + 1, "
        f"{quote('lease_id')} = %s, "
        f"{quote('locked_until')} = %s, {quote('next_attempt_at')} = %s, "
        f"{quote('updated_at')} = %s WHERE {where} RETURNING {', '.join(names)}"
    )


#: The statuses a claim takes, as SQL literals.
_DUE = f"{status_literal(Status.RECEIVED)}, {status_literal(Status.FAILED)}"


def claim_fresh_sql(using: str) -> str:
    """The claim of new and due rows (PostgreSQL), as :func:`claim_fresh` sends it."""

    def build(quote: Any, table: str) -> str:
        return _claim_sql(
            quote,
            table,
            f"{quote('id')} = ANY(ARRAY(SELECT {quote('id')} FROM {table} "
            f"WHERE {quote('consumer')} = %s AND {quote('status')} IN ({_DUE}) "
            f"AND {quote('next_attempt_at')} <= %s "
            f"ORDER BY {quote('next_attempt_at')}, {quote('id')} LIMIT %s FOR UPDATE SKIP LOCKED))",
        )

    return cached_sql(using, "claim_fresh", build)


def claim_fresh(
    consumer: str, limit: int, lease_id: str, until: datetime, now: datetime, using: str
) -> list[InboxMessage]:
    """PostgreSQL: claim ``received`` and due ``failed`` rows in one autocommit statement.

    ``UPDATE … WHERE id = ANY(ARRAY(SELECT … FOR UPDATE SKIP LOCKED)) RETURNING …``: the
    claim, its counted attempt and the lease commit together, one round trip per batch.
    ``= ANY(ARRAY(…))`` runs the locking subquery once; under ``IN (…)`` PostgreSQL may rescan
    it per row and claim more than ``limit`` rows. Returns the rows in primary-key order.
    """
    with preparing.cursor(using) as cursor:
        cursor.execute(claim_fresh_sql(using), [lease_id, until, until, now, consumer, now, limit])
        found = cursor.fetchall()
    return _claimed_rows(found, using)


def claim_message(
    consumer: str, message_id: str, lease_id: str, until: datetime, now: datetime, using: str
) -> list[InboxMessage]:
    """PostgreSQL: claim one ``received`` or due ``failed`` message by its id, in one
    autocommit statement (one probe of the unique index, whatever the statistics say: the
    status test matches no partial index, :func:`~.common.status_aside`); ``[]`` if it is not
    claimable."""

    def build(quote: Any, table: str) -> str:
        return _claim_sql(
            quote,
            table,
            f"{identity_sql(quote, 'postgresql')} "
            f"AND {status_aside(quote, Status.RECEIVED, Status.FAILED)} "
            f"AND {quote('next_attempt_at')} <= %s",
        )

    sql = cached_sql(using, "claim_message", build)
    with preparing.cursor(using) as cursor:
        params = [lease_id, until, until, now, *identity_params(consumer, message_id), now]
        cursor.execute(sql, params)
        found = cursor.fetchall()
    return _claimed_rows(found, using)


def _claimed_rows(found: list[Any], using: str) -> list[InboxMessage]:
    """Claimed rows as :class:`InboxMessage` objects, in primary-key order."""
    connection = connections[using]
    names = [field.attname for field in InboxMessage._meta.concrete_fields]
    json_fields = {
        index: InboxMessage._meta.get_field(name)
        for index, name in enumerate(names)
        if name in JSON_COLUMNS
    }
    rows = []
    for values in found:
        row = list(values)
        for index, field in json_fields.items():
            row[index] = field.from_db_value(row[index], None, connection)  # type: ignore[union-attr]
        rows.append(InboxMessage.from_db(using, names, row))
    rows.sort(key=lambda message: message.pk)
    return rows


def completion_sql(quote: Any, table: str, condition: str = "") -> str:
    """The fenced completion of a claimed row, ``condition`` added to its ``WHERE``.
    Parameters: now (``processed_at``), now (``updated_at``), the row's id, its lease id. The
    lease alone is the fence (see :mod:`django_inbox.processing.leases`: no ``status``
    condition)."""
    return (
        f"UPDATE {table} SET {quote('status')} = {status_literal(Status.COMPLETED)}, "
        f"{quote('processed_at')} = %s, {quote('updated_at')} = %s, "
        f"{quote('locked_until')} = NULL, {quote('next_attempt_at')} = NULL, "
        f"{quote('lease_id')} = '', {quote('last_error')} = '' "
        f"WHERE {quote('id')} = %s AND {quote('lease_id')} = %s{condition}"
    )


def complete(pk: int, lease_id: str, now: datetime, using: str) -> bool:
    """Mark a claimed row completed if ``lease_id`` still holds it: the fence of
    :func:`django_inbox.processing.leases.fenced`, written out for the hot path."""
    connection = connections[using]
    sql = cached_sql(
        using,
        "complete",
        completion_sql,
    )
    stamp = connection.ops.adapt_datetimefield_value(now)
    with preparing.cursor(using) as cursor:
        cursor.execute(sql, [stamp, stamp, pk, fence(lease_id)])
        return bool(cursor.rowcount == 1)
