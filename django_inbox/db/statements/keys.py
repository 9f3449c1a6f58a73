"""Ordered consumers' statements on an ordered key's row (``InboxKey``, PostgreSQL): its lock,
its applied sequence recorded, a new key's row created. Each is one round trip; the statements
on the key's versions (the message rows) are in :mod:`.ordered`."""

from __future__ import annotations

from typing import Any, NamedTuple

from ...models import InboxKey
from .. import preparing
from .common import cached_sql


class KeyState(NamedTuple):
    """A locked key's row: its applied sequence, and where a re-run under way rewound it from."""

    applied: int
    #: ``InboxKey.rerun_through``: the applied sequence a re-run rewound (``None``: none).
    through: int | None = None

    @property
    def rebuilding(self) -> bool:
        """Whether a re-run is under way: the key is below where it was before the re-run."""
        return self.through is not None and self.applied < self.through

    @property
    def rebuild_through(self) -> int | None:
        """``through`` while a re-run is under way, else ``None``."""
        return self.through if self.rebuilding else None


def state_of(applied: Any, through: Any) -> KeyState:
    return KeyState(int(applied), None if through is None else int(through))


def key_table(quote: Any) -> str:
    return str(quote(InboxKey._meta.db_table))


def lock_key(consumer: str, key: str, first: int, using: str, *, wait: bool) -> KeyState | None:
    """Lock ``key``'s row for this transaction and return its state; create it (``first - 1``
    applied) if it is new. ``None``: another transaction holds it (``wait`` false; with
    ``wait`` this waits for it instead)."""
    lock = "FOR UPDATE" if wait else "FOR UPDATE SKIP LOCKED"
    select = cached_sql(
        using,
        ("lock_key", wait),
        lambda quote, _: (
            f"SELECT {quote('applied_sequence')}, {quote('rerun_through')} "
            f"FROM {key_table(quote)} "
            f"WHERE {quote('consumer')} = %s AND {quote('key')} = %s {lock}"
        ),
    )
    with preparing.cursor(using) as cursor:
        cursor.execute(select, [consumer, key])
        found = cursor.fetchone()
        if found is not None:
            return state_of(*found)
        if not wait and _present(cursor, consumer, key, using):
            return None  # held by someone
        # New: the inserted row is ours and locked (with ``wait``, or the row's holder).
        cursor.execute(_insert_key_sql(using), [consumer, key, first - 1])
        inserted = cursor.fetchone()
        if inserted is not None:
            return KeyState(int(inserted[0]))
        if not wait:
            return None
        cursor.execute(select, [consumer, key])  # it was committed meanwhile: wait for it
        found = cursor.fetchone()
    return None if found is None else state_of(*found)


def lock_and_apply_sql(quote: Any) -> str:
    """The CTEs ``locked`` (the key's row, unless another transaction holds it) and ``moved``
    (its applied sequence set to the claimed version, if that is the next one and, unless the
    version is a re-run's, no re-run is under way). Parameters: consumer, key, sequence,
    consumer, key, sequence, whether the version is a re-run's."""
    applied, through = quote("applied_sequence"), quote("rerun_through")
    return (
        f"WITH locked AS (SELECT {applied}, {through} FROM {key_table(quote)} "
        f"WHERE {quote('consumer')} = %s AND {quote('key')} = %s FOR UPDATE SKIP LOCKED), "
        f"moved AS (UPDATE {key_table(quote)} SET {applied} = %s, "
        f"{quote('updated_at')} = now() WHERE {quote('consumer')} = %s "
        f"AND {quote('key')} = %s "
        f"AND (SELECT {applied} FROM locked) = %s::bigint - 1 "
        f"AND (%s OR NOT EXISTS (SELECT FROM locked WHERE {through} > {applied})) RETURNING 1)"
    )


def locked_state_sql(quote: Any) -> str:
    """The selected columns of ``locked``: applied sequence, re-run's rewind."""
    return (
        f"(SELECT {quote('applied_sequence')} FROM locked), "
        f"(SELECT {quote('rerun_through')} FROM locked)"
    )


def lock_and_apply(
    consumer: str, key: str, sequence: int | None, first: int, using: str, *, rerun: bool
) -> tuple[KeyState | None, bool]:
    """A worker's look at ``key`` for a claimed version: lock the key's row unless another
    transaction holds it, and if ``sequence`` is the key's next one, record it applied right
    away (the transaction commits it with the handler's writes, or rolls it back with them).
    One statement. Returns the applied sequence before (``None``: held by someone else) and
    whether it was moved to ``sequence``. A new key is created, applied up to ``sequence`` if
    that is ``first``."""
    sql = cached_sql(
        using,
        "lock_and_apply",
        lambda quote, _: (
            f"{lock_and_apply_sql(quote)} SELECT {locked_state_sql(quote)}, "
            f"EXISTS (SELECT FROM moved)"
        ),
    )
    with preparing.cursor(using) as cursor:
        cursor.execute(sql, [consumer, key, sequence, consumer, key, sequence, rerun])
        applied, through, moved = cursor.fetchone()
    if applied is not None:
        return state_of(applied, through), bool(moved)
    return new_key(consumer, key, sequence, first, using)


def new_key(
    consumer: str, key: str, sequence: int | None, first: int, using: str
) -> tuple[KeyState | None, bool]:
    """The key had no row (or another transaction holds it): create it, locked, applied up
    to ``sequence`` if that is ``first``. ``(None, False)``: another transaction holds it."""
    with preparing.cursor(using) as cursor:
        if _present(cursor, consumer, key, using):
            return None, False
        cursor.execute(
            _insert_key_sql(using), [consumer, key, first if sequence == first else first - 1]
        )
        if cursor.fetchone() is None:
            return None, False
    return KeyState(first - 1), sequence == first


def _present(cursor: Any, consumer: str, key: str, using: str) -> bool:
    """Whether ``key`` has a committed row, read without waiting for its lock: a row that
    ``FOR UPDATE SKIP LOCKED`` skipped is held by another transaction, and an ``INSERT … ON
    CONFLICT`` would wait for that transaction if it changed the row (a worker running a
    version updates it), instead of moving on to other keys."""
    sql = cached_sql(
        using,
        "key_present",
        lambda quote, _: (
            f"SELECT 1 FROM {key_table(quote)} "
            f"WHERE {quote('consumer')} = %s AND {quote('key')} = %s"
        ),
    )
    cursor.execute(sql, [consumer, key])
    return cursor.fetchone() is not None


def _insert_key_sql(using: str) -> str:
    return cached_sql(
        using,
        "insert_key",
        lambda quote, _: (
            f"INSERT INTO {key_table(quote)} ({quote('consumer')}, {quote('key')}, "
            f"{quote('applied_sequence')}, {quote('updated_at')}) VALUES (%s, %s, %s, now()) "
            f"ON CONFLICT ({quote('consumer')}, {quote('key')}) DO NOTHING "
            f"RETURNING {quote('applied_sequence')}"
        ),
    )


def advance_sql(quote: Any) -> str:
    """Record ``key``'s applied sequence. Parameters: the sequence, now, consumer, key."""
    return (
        f"UPDATE {key_table(quote)} SET {quote('applied_sequence')} = %s, "
        f"{quote('updated_at')} = %s WHERE {quote('consumer')} = %s AND {quote('key')} = %s"
    )
