"""Ordered consumers' statements on a key's versions (the message rows, PostgreSQL): for a
worker, the key's lock with the claimed version's apply, completion and the next version's
release, before the handler; the completions that release the next version; setting a version
aside. Each is one round trip; the key's own row is :mod:`.keys`, and other databases go
through the ORM (:mod:`django_inbox.ordered.ordering`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from django.db import connections

from .. import preparing
from .claiming import completion_sql
from .common import Status, cached_sql, fence, status_aside, status_literal
from .keys import KeyState, advance_sql, lock_and_apply_sql, locked_state_sql, new_key, state_of


class Taken(NamedTuple):
    """What :func:`lock_apply_complete` found and did."""

    #: The key's state before; ``None``: another transaction holds the key.
    state: KeyState | None
    #: The claimed version was recorded applied.
    moved: bool
    #: ``True``: the claimed row was completed too (its lease held); ``False``: it was not,
    #: its lease is lost; ``None``: not tried (the key was new, or the version not its next).
    completed: bool | None
    #: Message ids of the next version, made due.
    released: list[str]


def lock_apply_complete(
    consumer: str,
    key: str,
    sequence: int,
    first: int,
    pk: int,
    lease_id: str,
    now: datetime,
    using: str,
    *,
    rerun: bool,
) -> Taken:
    """:func:`lock_and_apply`, and when the claimed version is the key's next one, its
    fenced completion and the release of the next version too, all in one statement, before
    the handler runs: the transaction commits them with the handler's writes or rolls them
    back with them, so the inbox sends no statement after the handler (but the history of a
    re-run that suppressed side effects).
    The row's ``processed_at`` is then when its handler started."""

    def build(quote: Any, table: str) -> str:
        done = " AND EXISTS (SELECT FROM done)"
        return (
            f"{lock_and_apply_sql(quote)}, "
            f"done AS ({completion_sql(quote, table, ' AND EXISTS (SELECT FROM moved)')} "
            f"RETURNING 1), "
            f"released AS ({_release_sql(quote, table, done)}) "
            f"SELECT {locked_state_sql(quote)}, "
            f"EXISTS (SELECT FROM moved), EXISTS (SELECT FROM done), "
            f"(SELECT array_agg({quote('message_id')}) FROM released)"
        )

    sql = cached_sql(using, "lock_apply_complete", build)
    stamp = connections[using].ops.adapt_datetimefield_value(now)
    params: list[Any] = [consumer, key, sequence, consumer, key, sequence, rerun]
    params += [stamp, stamp, pk, fence(lease_id), stamp, stamp, consumer, key, sequence + 1]
    with preparing.cursor(using) as cursor:
        cursor.execute(sql, params)
        applied, through, moved, done, released = cursor.fetchone()
    if applied is None:
        state, moved = new_key(consumer, key, sequence, first, using)
        return Taken(state, moved, None, [])
    ids = [str(message_id) for message_id in released or []]
    return Taken(state_of(applied, through), bool(moved), bool(done) if moved else None, ids)


def _release_sql(quote: Any, table: str, condition: str) -> str:
    """Make a key's next version due: its ``waiting`` rows ``received`` now. Parameters: now
    (twice), consumer, key, the version. ``condition`` is added to the rows' choice.

    The rows are chosen and locked in a subquery whose status test matches no partial index
    (:func:`~.common.status_aside`), then updated by primary key: the key's versions index
    (``django_inbox_sequence_idx``) finds them. With a plain ``status = 'waiting'`` and
    statistics from before a backlog of waiting rows, PostgreSQL read the waiting rows'
    deadline index (``django_inbox_waiting_idx``) whole for each release."""
    return (
        f"UPDATE {table} SET {quote('status')} = {status_literal(Status.RECEIVED)}, "
        f"{quote('next_attempt_at')} = %s, {quote('updated_at')} = %s, "
        f"{quote('last_error')} = '' WHERE {quote('id')} = ANY(ARRAY("
        f"SELECT {quote('id')} FROM {table} WHERE {quote('consumer')} = %s "
        f"AND {quote('key')} = %s AND {quote('sequence')} = %s "
        f"AND {status_aside(quote, Status.WAITING)}{condition} "
        f"FOR NO KEY UPDATE)) RETURNING {quote('message_id')}"
    )


def advance(consumer: str, key: str, sequence: int, now: datetime, using: str) -> list[str]:
    """``key`` has applied ``sequence``: record it and make the next version's waiting rows
    due, in one statement; return their message ids."""
    sql = cached_sql(
        using,
        "advance",
        lambda quote, table: (
            f"WITH advanced AS ({advance_sql(quote)}) {_release_sql(quote, table, '')}"
        ),
    )
    stamp = connections[using].ops.adapt_datetimefield_value(now)
    with preparing.cursor(using) as cursor:
        cursor.execute(
            sql, [sequence, stamp, consumer, key, stamp, stamp, consumer, key, sequence + 1]
        )
        return [str(row[0]) for row in cursor.fetchall()]


def complete_ordered(
    pk: int,
    lease_id: str,
    consumer: str,
    key: str,
    sequence: int,
    now: datetime,
    using: str,
) -> tuple[bool, list[str]]:
    """The fenced completion of a claimed version that its key's lock already recorded
    applied (a new key's first version: :func:`lock_and_apply`), and the release of the next
    version, in one statement. Returns whether the lease still held the row (nothing else
    changes if not) and the released message ids."""

    def build(quote: Any, table: str) -> str:
        held = " AND EXISTS (SELECT FROM done)"
        return (
            f"WITH done AS ({completion_sql(quote, table)} RETURNING 1), "
            f"released AS ({_release_sql(quote, table, held)}) "
            f"SELECT (SELECT count(*) FROM done), "
            f"(SELECT array_agg({quote('message_id')}) FROM released)"
        )

    sql = cached_sql(using, "complete_ordered", build)
    stamp = connections[using].ops.adapt_datetimefield_value(now)
    params = [stamp, stamp, pk, fence(lease_id), stamp, stamp, consumer, key, sequence + 1]
    with preparing.cursor(using) as cursor:
        cursor.execute(sql, params)
        done, released = cursor.fetchone()
    return bool(done), [str(message_id) for message_id in released or []]


def set_aside(
    pk: int,
    lease_id: str,
    status: str,
    next_attempt_at: datetime | None,
    last_error: str,
    now: datetime,
    using: str,
) -> bool:
    """A claimed version that does not run now goes ``waiting`` or ``skipped``: its lease
    cleared, its claim's attempt taken back, fenced on the lease. One statement."""
    skipped = status == Status.SKIPPED

    def build(quote: Any, table: str) -> str:
        return (
            f"UPDATE {table} SET {quote('status')} = {status_literal(status)}, "
            f"{quote('attempts')} = GREATEST({quote('attempts')} - 1, 0), "
            f"{quote('lease_id')} = '', "
            f"{quote('locked_until')} = NULL, {quote('next_attempt_at')} = %s, "
            f"{quote('last_error')} = %s, {quote('updated_at')} = %s"
            + (f", {quote('processed_at')} = %s" if skipped else "")
            + f" WHERE {quote('id')} = %s AND {quote('lease_id')} = %s"
        )

    sql = cached_sql(using, ("set_aside", status), build)
    adapt = connections[using].ops.adapt_datetimefield_value
    stamp = adapt(now)
    params: list[Any] = [adapt(next_attempt_at), last_error, stamp]
    params += [stamp] if skipped else []
    with preparing.cursor(using) as cursor:
        cursor.execute(sql, [*params, pk, fence(lease_id)])
        return bool(cursor.rowcount == 1)
