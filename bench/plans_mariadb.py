"""Section 9b: the plans of the inbox's statements on MariaDB at a million rows.

The tables are filled with set-based SQL (MariaDB's ``seq`` tables): mostly completed rows, a
backlog, failed, dead, parked, waiting and in-progress rows across four consumers, and an
outbox of mostly sent rows. The inbox's own operations then run (a worker's claim and
completion, an ordered consumer's pass, ``inbox_stats``, the relay's claim, ``inbox_purge``,
``inbox_replay --dry-run``, ``inbox_reclaim --dry-run``, the health view, the admin's
changelist) with their statements captured, and each statement reading one of the tables is
explained once per shape: the access type, the index and the rows the optimiser expects to
read. None may read a table whole, apart from the exact counts of finished rows, which read
them by design until the table is estimated above ``ESTIMATE_ABOVE`` rows. Run by
``bench/databases.py``.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def empty_inbox() -> None:
    from django.db import connection

    from django_inbox.models import InboxMessage

    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {connection.ops.quote_name(InboxMessage._meta.db_table)}")


def fill(rows: int) -> dict[str, int]:
    """``rows`` rows in set-based SQL (MariaDB's ``seq`` tables): what a busy inbox holds,
    across consumers ``bench`` (whose handler the worker runs) and ``bench-1`` … ``bench-3``,
    and an ordered consumer's versions waiting for their gaps."""
    from django.db import connection

    shares = {  # status: share of the rows (the rest completed)
        "received": 0.02,
        "failed": 0.005,
        "dead": 0.003,
        "parked": 0.001,
        "waiting": 0.001,
        "in_progress": 0.0005,
    }
    counts = {status: int(rows * share) for status, share in shares.items()}
    counts["completed"] = rows - sum(counts.values())
    start = 1
    with connection.cursor() as cursor:
        for status, count in counts.items():
            ordered = status == "waiting"
            processed = "NOW(6) - INTERVAL ((%s - seq) * 10) SECOND"  # 10 s apart, oldest first
            due = {
                "received": "NOW(6)",
                "failed": "NOW(6) + INTERVAL 1 HOUR",
                "waiting": "NOW(6) + INTERVAL 1 HOUR",
            }.get(status, "NULL")
            cursor.execute(
                "INSERT INTO django_inbox_inboxmessage (consumer, message_id, source, "
                "event_type, `key`, payload, headers, status, attempts, last_error, history, "
                "received_at, updated_at, next_attempt_at, locked_until, lease_id, "
                "processed_at, sequence, rerun, skip_requested) "
                f"SELECT {'%s' if ordered else 'IF(seq %% 4 = 0, %s, CONCAT(%s, seq %% 4))'}, "
                "MD5(seq), '', %s, "
                f"{'CONCAT(%s, seq %% 1000)' if ordered else '%s'}, "
                "CONCAT('{\"sku\": \"sku-', seq %% 50, '\"}'), '{}', %s, 1, '', '[]', "
                "NOW(6) - INTERVAL (%s - seq) SECOND, NOW(6) - INTERVAL (%s - seq) SECOND, "
                f"{due}, "
                f"{'NOW(6) + INTERVAL 5 MINUTE' if status == 'in_progress' else 'NULL'}, "
                f"{'MD5(seq)' if status == 'in_progress' else chr(39) * 2}, "
                f"{processed if status == 'completed' else 'NULL'}, "
                f"{'seq + 1' if ordered else 'NULL'}, 0, 0 "
                f"FROM seq_{start}_to_{start + count - 1}",
                [
                    *(["bench-ordered"] if ordered else ["bench", "bench-"]),
                    "bench.take",
                    "key-" if ordered else "",
                    status,
                    start + rows,
                    start + rows,
                    *([rows] if status == "completed" else []),
                ],
            )
            start += count
        cursor.execute("ANALYZE TABLE django_inbox_inboxmessage")
        cursor.fetchall()
    return counts


def operations() -> list[tuple[str, Any]]:
    from io import StringIO

    from django.contrib.auth.models import User
    from django.core.management import CommandError, call_command
    from django.test import Client

    from bench.inbox_handlers import CONSUMER
    from django_inbox.outbox import rows as relay_rows
    from django_inbox.processing.worker import Worker

    def command(*args: str) -> Any:
        def run() -> None:
            try:
                call_command(*args, stdout=StringIO(), stderr=StringIO())
            except CommandError as exc:  # inbox_stats: the problems it found (dead rows…)
                if "problem" not in str(exc):
                    raise

        return run

    def admin() -> None:
        user = User.objects.filter(username="bench-admin").first() or (
            User.objects.create_superuser("bench-admin", "a@example.com", "pw")
        )
        client = Client(HTTP_HOST="localhost")
        client.force_login(user)
        for query in ("", "?status__exact=dead", "?q=evt-1"):
            response = client.get(f"/admin/django_inbox/inboxmessage/{query}")
            assert response.status_code == 200, (query, response.status_code)

    def health() -> None:
        from django.test import RequestFactory

        from django_inbox.contrib.health import health_view

        health_view(RequestFactory().get("/health"))

    return [
        (
            "worker: claim and complete",
            lambda: Worker(consumers=[CONSUMER], max_messages=50, until_idle=0).run(),
        ),
        (
            "worker: ordered consumer (bench-ordered)",
            lambda: Worker(consumers=["bench-ordered"], max_messages=5, until_idle=0).run(),
        ),
        ("inbox_stats", command("inbox_stats", "--json")),
        ("outbox relay: claim", lambda: relay_rows.claim(100, "default")),
        ("inbox_purge --outbox", command("inbox_purge", "--outbox")),
        # Completed rows were processed 10 s apart, the oldest 112 days ago at a million rows:
        # those older than 104 days (70,939 of them) are deleted in batches of 1,000.
        ("inbox_purge", command("inbox_purge", "--older-than", "104d", "--batch-size", "1000")),
        (
            "inbox_purge --status dead",
            command("inbox_purge", "--status", "dead", "--older-than", "3650d"),
        ),
        ("inbox_replay --all --dry-run", command("inbox_replay", "--all", "--dry-run")),
        ("inbox_reclaim --dry-run", command("inbox_reclaim", "--dry-run")),
        ("health view", health),
        ("admin changelist", admin),
    ]


#: An alias of one of the tables in a subquery: the outbox claim's ``e`` (``held.first_of_key``)
#: and Django's ``U0``, ``U1``…
ALIAS = re.compile(r"e|U\d+")


def shape(sql: str) -> str:
    """A statement with its times, leases and numbers masked: the same statement with other
    such values is one. Statuses, consumers and other names are kept (a purge's batch of
    completed rows and one of skipped rows are two statements, with two plans)."""
    varying = r"'(?:\d{4}-\d\d-\d\d[^']*|[0-9a-f]{8}-[0-9a-f-]{27}|[0-9a-f]{32})'"
    return re.sub(r"\b\d+\b", "N", re.sub(varying, "?", sql))


def counted_exactly(sql: str) -> bool:
    """The counts of finished rows (``inbox_stats``, the health view, the admin's summary),
    which read them all by design while the table is estimated at ``ESTIMATE_ABOVE`` rows or
    fewer (then they take the estimate): the inbox's completed and skipped rows, the outbox's
    sent ones."""
    finished = "IN ('completed', 'skipped')" in sql and "GROUP BY" in sql
    return finished or ("COUNT(*)" in sql and sql.endswith("`status` = 'sent'"))


def bounded(sql: str, key: str | None) -> bool:
    """A statement that reads about its ``LIMIT`` however large the table: no condition
    before it (the admin's count, capped by its paginator), or a batch in primary-key order
    (``inbox_purge``, ``inbox_replay``) whose rows come first in that order, which the
    optimiser cannot see (its operation's rows read tell)."""
    limited = re.search(r" LIMIT \d+", sql) is not None
    in_id_order = key == "PRIMARY" and "ORDER BY" in sql
    return limited and (" WHERE " not in sql or in_id_order)


def rows_read() -> int:
    """Rows this connection's statements have read so far (InnoDB's handler counters)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        return sum(int(value) for _name, value in cursor.fetchall())


def fill_outbox(rows: int) -> dict[str, int]:
    """``rows`` outbox rows: nearly all sent, a pending backlog (some keyed), a few dead."""
    from django.db import connection

    shares = {"pending": 0.02, "dead": 0.002}
    counts = {status: int(rows * share) for status, share in shares.items()}
    counts["sent"] = rows - sum(counts.values())
    start = 1
    with connection.cursor() as cursor:
        for status, count in counts.items():
            cursor.execute(
                "INSERT INTO django_inbox_outbox_outboxmessage (message_id, event_type, payload, "
                "headers, exchange, routing_key, `key`, status, attempts, last_error, "
                "created_at, updated_at, next_attempt_at, lease_id, causation_consumer, "
                "causation_message_id, sent_at) "
                "SELECT MD5(seq), 'bench.sent', '{}', '{}', '', 'bench', "
                "IF(seq %% 3 = 0, CONCAT('order-', seq %% 500), ''), %s, 1, '', "
                "NOW(6) - INTERVAL seq SECOND, NOW(6) - INTERVAL seq SECOND, "
                f"{'NOW(6)' if status == 'pending' else 'NOW(6) - INTERVAL seq SECOND'}, '', "
                f"'', '', {'NOW(6) - INTERVAL seq SECOND' if status == 'sent' else 'NULL'} "
                f"FROM seq_{start}_to_{start + count - 1}",
                [status],
            )
            start += count
        cursor.execute("ANALYZE TABLE django_inbox_outbox_outboxmessage")
        cursor.fetchall()
    return counts


def explain(sql: str) -> list[dict[str, Any]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def plans(rows: int) -> dict[str, Any]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_inbox.models import InboxMessage
    from django_inbox.outbox.models import OutboxMessage

    table = InboxMessage._meta.db_table
    tables = (table, OutboxMessage._meta.db_table)
    empty_inbox()
    began = time.perf_counter()
    counts = fill(rows)
    outbox_rows = rows // 5
    counts["outbox"] = fill_outbox(outbox_rows)
    log(
        f"   filled {rows:,} + {outbox_rows:,} rows in "
        f"{time.perf_counter() - began:.0f} s: {counts}"
    )
    found: list[dict[str, Any]] = []
    read: dict[str, int] = {}
    for name, op in operations():
        before = rows_read()
        with CaptureQueriesContext(connection) as queries:
            began = time.perf_counter()
            op()
            wall = time.perf_counter() - began
        read[name] = rows_read() - before
        statements = [
            q["sql"]
            for q in queries.captured_queries
            if any(t in q["sql"] for t in tables)
            and q["sql"].lstrip().split()[0].upper() in ("SELECT", "UPDATE", "DELETE")
        ]
        shapes = {shape(sql): sql for sql in statements}  # each statement's shape once
        for sql in shapes.values():
            for step in explain(sql):
                name_read = str(step.get("table") or "")
                if name_read not in tables and not ALIAS.fullmatch(name_read):
                    continue  # another table, or a derived table's placeholder (<derived2>)
                expected = int(re.match(r"\d*", str(step.get("rows") or "")).group() or 0)
                size = outbox_rows if name_read == tables[1] else rows
                found.append(
                    {
                        "operation": name,
                        "seconds": round(wall, 3),
                        "sql": sql[:600],
                        "type": step.get("type"),
                        "key": step.get("key"),
                        "rows": expected,
                        "extra": step.get("Extra"),
                        "table": name_read,
                        "by_design": counted_exactly(sql),
                        "whole": not bounded(sql, step.get("key"))
                        and not counted_exactly(sql)
                        and (step.get("type") == "ALL" or expected > size // 10),
                    }
                )
    return {"rows": rows, "counts": counts, "statements": found, "rows_read": read}


def plan_report(database: str, p: dict[str, Any]) -> list[str]:
    """The plans as Markdown lines."""
    whole = [s for s in p["statements"] if s["whole"]]
    lines = [
        "",
        f"## {database}: plans at {p['rows']:,} rows",
        "",
        f"Rows by status: {p['counts']}. Statement shapes reading the inbox's or the outbox's "
        f"table: {len(p['statements'])}; reading one whole: {len(whole)}.",
        "",
        "Rows each operation read (InnoDB's handler counters of its connection: every row "
        "and index entry a statement touched, whatever the optimiser expected):",
        "",
        "| Operation | rows read |",
        "|---|---|",
        *(f"| {name} | {count:,} |" for name, count in p.get("rows_read", {}).items()),
        "",
        "The plans, each statement shape once:",
        "",
        "| Operation | table | access | index | rows expected | statement |",
        "|---|---|---|---|---|---|",
    ]
    for s in p["statements"]:
        sql = s["sql"].replace("|", "\\|").replace("\n", " ")[:160]
        mark = " **whole table**" if s["whole"] else ""
        if s["by_design"]:
            mark = " (the exact count below the estimate's threshold)"
        lines.append(
            f"| {s['operation']} | {s['table'].removeprefix('django_inbox_')} | "
            f"{s['type']}{mark} | {s['key']} | {s['rows']:,} | `{sql}` |"
        )
    return lines
