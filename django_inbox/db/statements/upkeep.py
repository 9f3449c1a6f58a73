"""The statements of operators and upkeep: a history entry appended in SQL, a locked batch
deleted, the planner's row estimate, a loose index scan of the consumers."""

from __future__ import annotations

import json
from typing import Any

from django.db import connections

from ...models import InboxMessage, InboxTombstone
from ..identity import CONSUMER_SQL
from ..tombstones import DIGEST_FUNCTION, PURGE_LOCK, Keeping
from .common import quote_of, status_exactly, table_of

# --- operators and upkeep ----------------------------------------------------------------


def update_appending_history(
    pks: list[int],
    statuses: list[str],
    changes: dict[str, Any],
    entry: dict[str, Any],
    using: str,
) -> None:
    """PostgreSQL: change rows in one statement, appending ``entry`` to each one's history in
    SQL. ``from`` and ``attempts`` of each entry are the row's values before the update (in an
    ``UPDATE``, column references in ``SET`` read the old row)."""
    quote = quote_of(using)
    sets: list[str] = []
    params: list[Any] = []
    for column, value in changes.items():
        sets.append(f"{quote(column)} = %s")
        params.append(value)
    pairs: list[str] = []
    for key, value in entry.items():
        if key in ("from", "attempts"):
            continue
        pairs.append("%s, %s::text")
        params += [key, value]
    pairs.append(f"'from', {quote('status')}, 'attempts', {quote('attempts')}")
    history = (
        f"{quote('history')} = {quote('history')} || "
        f"jsonb_build_array(jsonb_build_object({', '.join(pairs)}))"
    )
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"UPDATE {table_of(using)} SET {', '.join(sets)}, {history} "
            f"WHERE {quote('id')} = ANY(%s) AND {status_exactly(quote)} = ANY(%s)",
            [*params, pks, statuses],
        )


def delete_selected(
    select_sql: str,
    params: list[Any],
    status: str,
    using: str,
    keep: Keeping | None = None,
) -> tuple[list[int], int]:
    """Delete the rows whose ids ``select_sql`` returns, re-checking each one's ``status`` as it
    is deleted (a row replayed meanwhile is kept); return the deleted ids and how many
    tombstones were kept.

    With ``keep`` (PostgreSQL, ``completed`` rows), the same statement keeps a tombstone of
    each deleted row whose consumer keeps them (:mod:`django_inbox.db.tombstones`), its digest
    computed by the function of migration 0015; the transaction first takes the advisory lock
    that a late copy's trigger waits for (:data:`~django_inbox.db.tombstones.PURGE_LOCK`).

    On PostgreSQL ``id = ANY(ARRAY(…))`` runs the (locking) selection once, as an InitPlan.
    Under ``IN (…)`` PostgreSQL may plan a nested-loop semi-join that rescans it for every outer
    row; each rescan skips the rows already deleted and its LIMIT takes the next ones, so one
    "batch" would delete every expired row in one long transaction.
    """
    connection = connections[using]
    quote = quote_of(using)
    pk = quote("id")
    if connection.vendor == "postgresql":
        selected = f"{pk} = ANY(ARRAY({select_sql}))"
    else:
        selected = f"{pk} IN ({select_sql})"
    delete = (
        f"DELETE FROM {table_of(using)} WHERE {selected} "
        f"AND {status_exactly(quote, connection.vendor)} = %s"
    )
    with connection.cursor() as cursor:
        if keep is None:
            cursor.execute(f"{delete} RETURNING {pk}", [*params, status])
            return [int(found[0]) for found in cursor.fetchall()], 0
        # Late copies of these rows wait for this purge to commit (the trigger of 0015).
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PURGE_LOCK])
        seconds, seconds_params = keep.seconds_sql(quote("consumer"))
        stones = quote(InboxTombstone._meta.db_table)
        cursor.execute(
            f"WITH gone AS ({delete} RETURNING {pk}, {quote('consumer')}, "
            f"{quote('message_id')}, {quote('processed_at')}), "
            f"kept AS (INSERT INTO {stones} (digest, completed_at, purged_at, expires_at) "
            f"SELECT {DIGEST_FUNCTION}({quote('consumer')}, {quote('message_id')}), "
            f"{quote('processed_at')}, %s, %s + make_interval(secs => secs) "
            f"FROM (SELECT *, {seconds} AS secs FROM gone) AS kept_for WHERE secs IS NOT NULL "
            "ON CONFLICT (digest) DO UPDATE SET completed_at = EXCLUDED.completed_at, "
            "purged_at = EXCLUDED.purged_at, expires_at = EXCLUDED.expires_at RETURNING 1) "
            f"SELECT {pk}, (SELECT count(*) FROM kept) FROM gone",
            [*params, status, keep.now, keep.now, *seconds_params],
        )
        found = cursor.fetchall()
    return [int(row[0]) for row in found], int(found[0][1]) if found else 0


def estimated_rows(using: str, table: str | None = None) -> int:
    """The database's estimate of the rows of ``table`` (the inbox's if ``None``), with no
    scan; ``0`` on SQLite or if unknown.

    On PostgreSQL the planner's own estimate (``EXPLAIN SELECT … FROM table``): ``reltuples``
    of the last ``ANALYZE``/``VACUUM`` scaled to the table's current size, so it follows a
    table that grew since (autovacuum may be off), and a guess from the table's size if it
    never was analysed. On MariaDB and MySQL, InnoDB's ``TABLE_ROWS`` (sampled statistics,
    off by up to half, which InnoDB refreshes once a tenth of the table changed; MySQL 8
    also caches them for ``information_schema_stats_expiry``, a day by default). After a
    large delete (a purge) InnoDB's estimate can be far too low, down to 0, until the table
    is rebuilt: callers then count exactly, which is slower but never wrong.
    """
    connection = connections[using]
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT TABLE_ROWS FROM information_schema.TABLES "
                "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
                [table or InboxMessage._meta.db_table],
            )
            found = cursor.fetchone()
        return max(int(found[0] or 0), 0) if found else 0
    if connection.vendor != "postgresql":
        return 0
    with connection.cursor() as cursor:
        name = table_of(using) if table is None else connection.ops.quote_name(table)
        cursor.execute(f"EXPLAIN (FORMAT JSON) SELECT 1 FROM {name}")
        found = cursor.fetchone()
    if not found:
        return 0
    plan = json.loads(found[0]) if isinstance(found[0], str | bytes) else found[0]
    try:
        rows = plan[0]["Plan"]["Plan Rows"]
    except (LookupError, TypeError):
        return 0
    return max(int(rows), 0)


def distinct_consumers(using: str) -> list[str]:
    """Every consumer that has rows. On PostgreSQL a walk of the index of consumers, one
    probe per consumer (a loose index scan), so it stays instant on a table of millions of
    rows."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        rows = InboxMessage.objects.using(using).order_by()
        return sorted(rows.values_list("consumer", flat=True).distinct())
    table = table_of(using)
    column = CONSUMER_SQL  # the indexed expression (db/identity.py)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH RECURSIVE walk(name) AS ("
            f"SELECT min({column}) FROM {table} "
            f"UNION ALL SELECT (SELECT min({column}) FROM {table} WHERE {column} > walk.name) "
            f"FROM walk WHERE walk.name IS NOT NULL) "
            f"SELECT name FROM walk WHERE name IS NOT NULL"
        )
        return [str(name) for (name,) in cursor.fetchall()]


def server_encoding(using: str) -> str:
    """The PostgreSQL database's encoding (``UTF8``, ``LATIN1``…), for check W005."""
    with connections[using].cursor() as cursor:
        cursor.execute("SHOW server_encoding")
        return str(cursor.fetchone()[0])
