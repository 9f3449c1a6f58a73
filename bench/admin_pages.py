#!/usr/bin/env python
"""The admin's changelist, summary and detail page on a large inbox table.

Run it with one command::

    .venv/bin/python -m bench.admin_pages

It creates (drops first) the database named in ``DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/inbox_bench_admin``; its name must contain ``bench``, as
it is dropped), migrates it, fills the inbox table with ``ADMIN_BENCH_ROWS`` rows (1,000,000)
by one ``INSERT … SELECT generate_series``, runs ``VACUUM (ANALYZE)``, logs a superuser in with
Django's test ``Client`` and requests each page of :func:`pages` ``ADMIN_BENCH_RUNS`` times (5)
after one warm-up request: wall time (median and max), the number of SQL queries and their
time, and the plan of every query on the inbox table. Baselines of the same run: the bare
``SELECT … ORDER BY id DESC LIMIT 50`` of a page of rows, a ``SELECT count(*)`` of the whole
table (what a full count would cost each page), and the summary's exact count of completed
rows. It writes ``bench/results/admin.md`` and ``bench/results/admin.json`` and drops the
database (``ADMIN_BENCH_KEEP_DB=1`` keeps it).

The seed, the pages and the query checks are shared with ``tests/test_admin_scale.py``, so
importing this module has no side effect: only :func:`main` sets Django up.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

from bench.common import code_version

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"

TABLE = "django_inbox_inboxmessage"
#: Consumers of the seeded rows: those of the test project, so the filters list them.
CONSUMERS = ("inventory", "payments", "audit", "stream", "effects")
#: Event types, by share of rows: order.placed 40 %, effect.write 20 %, the rest 10 % each.
EVENT_TYPES = (
    "order.placed",
    "order.placed",
    "effect.write",
    "order.paid",
    "order.placed",
    "order.shipped",
    "effect.write",
    "refund.issued",
    "customer.updated",
    "order.placed",
)
#: Indexes of the inbox table that a page's rows may come through.
INBOX_INDEXES = (
    "django_inbox_attention_idx",
    "django_inbox_polled_idx",
    "django_inbox_unique_consumer_message",
    f"{TABLE}_pkey",
)

# One statement, all in the server: row i (1 … n) belongs to consumer i % 5 and arrived
# (n - i) * 30 days / n ago, so ids follow arrival as they do in a real inbox and the last
# hour holds n / 720 rows. Statuses: the newest 1,500 rows are received and the 100 before
# them in progress (their lease still running); every 499th row is dead (2,000 on 1M rows,
# spread over the whole month), every 3,001st parked, and every 71st of the last 72,000
# failed (waiting for their retry); everything else is completed. Payloads are about 200
# bytes of order JSON; failed rows carry one history entry with a traceback.
SEED_SQL = """
INSERT INTO django_inbox_inboxmessage (
    consumer, message_id, source, event_type, key, payload, headers, status, attempts,
    last_error, history, received_at, updated_at, next_attempt_at, locked_until, lease_id,
    processed_at)
SELECT
    r.consumer, r.message_id, 'shop.orders', r.event_type, 'customer-' || r.customer,
    jsonb_build_object(
        'order_id', 'ORD-' || lpad(r.i::text, 9, '0'),
        'customer_id', 'CUS-' || r.customer,
        'amount', round((r.i * 37 % 100000) / 100.0, 2),
        'currency', 'EUR',
        'items', jsonb_build_array(jsonb_build_object(
            'sku', 'SKU-' || (r.i % 5000), 'qty', 1 + r.i % 3,
            'price', round((r.i * 13 % 10000) / 100.0, 2))),
        'placed_at', to_char(r.received_at, 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        'channel', 'web'),
    jsonb_build_object('content_type', 'application/json', 'trace_id', md5('trace-' || r.i)),
    r.status,
    CASE r.status WHEN 'received' THEN 0 WHEN 'dead' THEN 8 WHEN 'failed' THEN 1 + r.i % 3
        ELSE 1 END,
    CASE WHEN r.status IN ('dead', 'failed')
        THEN 'TimeoutError: payment gateway timed out after 30s'
        WHEN r.status = 'parked' THEN 'Park: held for manual review' ELSE '' END,
    CASE WHEN r.status IN ('dead', 'failed', 'parked') THEN jsonb_build_array(jsonb_build_object(
        'kind', 'error', 'at', to_char(r.received_at, 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'),
        'type', 'TimeoutError', 'message', 'payment gateway timed out after 30s',
        'traceback', E'Traceback (most recent call last):\\n  File "shop/handlers.py", line 42, '
            || E'in charge\\nTimeoutError: payment gateway timed out after 30s\\n',
        'attempt', 1, 'outcome', r.status, 'retry_at', NULL))
        ELSE '[]'::jsonb END,
    r.received_at,
    r.received_at + CASE r.status WHEN 'dead' THEN interval '10 minutes'
        WHEN 'received' THEN interval '0' ELSE interval '1 second' END,
    CASE r.status WHEN 'received' THEN r.received_at
        WHEN 'failed' THEN now() + (r.i % 600) * interval '1 second'
        WHEN 'in_progress' THEN now() + interval '30 seconds' END,
    CASE WHEN r.status = 'in_progress' THEN now() + interval '30 seconds' END,
    CASE WHEN r.status = 'in_progress' THEN md5('lease-' || r.i)::uuid::text ELSE '' END,
    CASE WHEN r.status = 'completed' THEN r.received_at + interval '50 milliseconds' END
FROM (
    SELECT
        i,
        (ARRAY['{consumers}'])[1 + i % {n_consumers}] AS consumer,
        md5('message-' || i)::uuid::text AS message_id,
        (ARRAY['{event_types}'])[1 + (i / {n_consumers}) % {n_event_types}] AS event_type,
        i * 7919 % 100000 AS customer,
        now() - ({n} - i) * (interval '30 days' / {n}) AS received_at,
        CASE
            WHEN i > {n} - 1500 THEN 'received'
            WHEN i > {n} - 1600 THEN 'in_progress'
            WHEN i % 499 = 123 THEN 'dead'
            WHEN i % 3001 = 7 THEN 'parked'
            WHEN i > {n} - 72000 AND i % 71 = 3 THEN 'failed'
            ELSE 'completed'
        END AS status
    FROM generate_series(1::bigint, {n}) AS i
) AS r
"""


def seed_sql(rows: int) -> str:
    """The ``INSERT … SELECT generate_series`` that adds ``rows`` rows (see :data:`SEED_SQL`)."""
    if rows < 2000:
        raise ValueError("seed at least 2,000 rows")
    return SEED_SQL.format(
        n=int(rows),
        consumers="', '".join(CONSUMERS),
        n_consumers=len(CONSUMERS),
        event_types="', '".join(EVENT_TYPES),
        n_event_types=len(EVENT_TYPES),
    )


def seed(rows: int, *, vacuum: bool = True) -> float:
    """Add ``rows`` rows to the inbox table of Django's default database, then ``VACUUM
    (ANALYZE)`` it (``ANALYZE`` alone with ``vacuum=False``, e.g. inside a transaction).
    Returns the seconds taken."""
    from django.db import connection

    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(seed_sql(rows))
        cursor.execute(f"{'VACUUM (ANALYZE)' if vacuum else 'ANALYZE'} {TABLE}")
    return time.perf_counter() - began


# ----------------------------------------------------------------------------- pages


@dataclass(frozen=True)
class Page:
    key: str
    title: str
    url: str
    #: Indexes the plan of the page's row query must read the rows through (not the primary
    #: key: walking it newest first while filtering on a rare value may read the whole table).
    needs_index: tuple[str, ...] = ()


@dataclass(frozen=True)
class Targets:
    """What the pages look for: a consumer, a message id and a row to open."""

    consumer: str
    message_id: str
    detail_pk: int
    event_type: str = "order.paid"


def targets() -> Targets:
    """A dead row near the middle of the table: its consumer, message id and primary key."""
    from django_inbox.models import InboxMessage

    rows = InboxMessage.objects.filter(status="dead", consumer="payments").order_by("updated_at")
    count = rows.count()
    row = rows.values("pk", "consumer", "message_id")[count // 2]
    return Targets(consumer=row["consumer"], message_id=row["message_id"], detail_pk=row["pk"])


def pages(found: Targets) -> list[Page]:
    """The pages an operator opens during triage, as in the summary's and filters' links."""
    from django.urls import reverse

    changelist = reverse("admin:django_inbox_inboxmessage_changelist")

    def url(**params: Any) -> str:
        return f"{changelist}?{urlencode(params)}" if params else changelist

    attention = ("django_inbox_attention_idx",)
    return [
        Page("list", "changelist, no filter", url()),
        Page("dead", "status = dead", url(status__exact="dead"), needs_index=attention),
        Page("completed", "status = completed", url(status__exact="completed")),
        Page("consumer", f"consumer = {found.consumer}", url(consumer=found.consumer)),
        Page(
            "consumer_failed",
            f"consumer = {found.consumer}, status = failed",
            url(consumer=found.consumer, status__exact="failed"),
            needs_index=("django_inbox_polled_idx",),
        ),
        Page(
            "consumer_dead",
            f"consumer = {found.consumer}, status = dead",
            url(consumer=found.consumer, status__exact="dead"),
            needs_index=attention,
        ),
        Page("event_type", f"event type = {found.event_type}", url(event_type=found.event_type)),
        Page("received_1h", "received in the last hour", url(received="1h")),
        Page(
            "search",
            "search: exact message id",
            url(q=found.message_id),
            needs_index=("django_inbox_unique_consumer_message",),
        ),
        Page("page_50", "page 50, no filter", url(p=50)),
        Page(
            "detail",
            "detail page of a dead row",
            reverse("admin:django_inbox_inboxmessage_change", args=[found.detail_pk]),
        ),
    ]


# ----------------------------------------------------------------------------- query checks

POLLED = frozenset({"received", "failed", "in_progress"})
ATTENTION = frozenset({"dead", "parked"})
_STATUS_IN = re.compile(r'"status"\s+IN\s+\(([^)]*)\)', re.IGNORECASE)
_STATUS_EQ = re.compile(r"\"status\"\s+=\s+'([^']*)'", re.IGNORECASE)
_LIMITED_SUBQUERY = re.compile(r"COUNT\(\*\)\s+FROM\s+\(SELECT\b.*\bLIMIT\s+\d+\)", re.S | re.I)


def statuses_of(sql: str) -> set[str]:
    """The statuses a query's WHERE restricts the rows to (empty: no status restriction)."""
    found: set[str] = set()
    for group in _STATUS_IN.findall(sql):
        found.update(re.findall(r"'([^']*)'", group))
    found.update(_STATUS_EQ.findall(sql))
    return found


def on_partial_index(sql: str) -> bool:
    """Whether the rows are restricted to the statuses of one of the partial indexes (few rows:
    dead/parked or those still to process)."""
    statuses = statuses_of(sql)
    return bool(statuses) and (statuses <= POLLED or statuses <= ATTENTION)


def full_table_query(sql: str) -> str | None:
    """Why ``sql`` would read the whole inbox table, or ``None``: a ``COUNT`` not bounded by a
    ``LIMIT`` subquery, or a ``SELECT DISTINCT``, unless its rows are restricted to a partial
    index's statuses."""
    if f'"{TABLE}"' not in sql or on_partial_index(sql):
        return None
    if re.search(r"\bCOUNT\(", sql, re.I) and not _LIMITED_SUBQUERY.search(sql):
        return "unbounded count"
    if re.search(r"\bSELECT\s+DISTINCT\b", sql, re.I):
        return "SELECT DISTINCT"
    return None


def row_query(queries: list[dict[str, Any]]) -> str | None:
    """The query that fetches the changelist's rows: the last ordered ``SELECT`` of inbox rows
    that is not a count (the changelist's ordering always ends with the primary key)."""
    found = None
    for query in queries:
        sql = query["sql"]
        if (
            sql.startswith("SELECT")
            and f'FROM "{TABLE}"' in sql
            and re.search(rf'ORDER BY .*"{TABLE}"\."id" DESC', sql)
            and "COUNT(" not in sql.upper()
        ):
            found = str(sql)
    return found


def explain(sql: str, *, analyze: bool = False) -> str:
    """The plan of ``sql`` (as captured, parameters inlined) on Django's default database."""
    from django.db import connection

    options = "ANALYZE, BUFFERS, " if analyze else ""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN ({options}FORMAT TEXT) {sql}")
        return "\n".join(line for (line,) in cursor.fetchall())


_SCAN = re.compile(
    r"(Seq Scan|Parallel Seq Scan|Index Scan Backward|Index Scan|Index Only Scan|"
    r"Bitmap Index Scan)(?: using (\S+))? on (\S+)"
)


def scans(plan: str) -> list[str]:
    """The plan's table and index accesses, e.g. ``Index Scan using x on t``, in order."""
    found = []
    for kind, index, table in _SCAN.findall(plan):
        if kind == "Bitmap Index Scan":  # "Bitmap Index Scan on <index>"
            found.append(f"{kind} on {table}")
        elif index:
            found.append(f"{kind} using {index}")
        elif table == TABLE:
            found.append(kind)
    return found


def uses_index(plan: str, indexes: tuple[str, ...] = INBOX_INDEXES) -> bool:
    """Whether the plan reads the inbox through one of ``indexes`` and never by a sequential
    scan of it."""
    accesses = scans(plan)
    if any("Seq Scan" in access for access in accesses):
        return False
    return any(access.rsplit(" ", 1)[-1] in indexes for access in accesses)


def full_scans(sql: str) -> list[str]:
    """Sequential scans of the inbox in the plan of ``sql`` (``EXPLAIN``, not run) that read
    the whole table: those without a ``LIMIT`` above them that PostgreSQL expects to reach.
    A scan under ``LIMIT n`` whose filter matches many more rows stops after about ``n``
    matches (``SELECT count(*) FROM (… LIMIT 10001)`` of completed rows reads ~10,000 rows);
    one whose filter matches fewer rows than the limit reads everything."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        found = cursor.fetchone()[0]
    plan = json.loads(found) if isinstance(found, str | bytes) else found
    unbounded: list[str] = []

    def walk(node: dict[str, Any], bounded: bool) -> None:
        kind = node.get("Node Type", "")
        if kind == "Seq Scan" and node.get("Relation Name") == TABLE and not bounded:
            parallel = " (parallel)" if node.get("Parallel Aware") else ""
            unbounded.append(f"Seq Scan{parallel} on {TABLE}, filter {node.get('Filter', '-')}")
        children = node.get("Plans", [])
        for child in children:
            reached = kind == "Limit" and node.get("Plan Rows", 0) < child.get("Plan Rows", 0)
            walk(child, bounded or reached)

    walk(plan[0]["Plan"], False)
    return unbounded


# ----------------------------------------------------------------------------- measuring


@dataclass
class Visit:
    response: Any
    seconds: float
    queries: list[dict[str, Any]]

    @property
    def status(self) -> int:
        return int(self.response.status_code)

    @property
    def sql_seconds(self) -> float:
        return sum(float(q.get("time") or 0) for q in self.queries)


def visit(client: Any, url: str) -> Visit:
    """GET ``url`` with the client, timing it and capturing its SQL."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        began = time.perf_counter()
        response = client.get(url)
        seconds = time.perf_counter() - began
    return Visit(response, seconds, list(captured.captured_queries))


def login(client: Any) -> None:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench-admin").first()
    if user is None:
        user = user_model.objects.create_superuser("bench-admin", "bench@example.com", None)
    client.force_login(user)


def time_sql(sql: str, runs: int) -> list[float]:
    from django.db import connection

    times = []
    with connection.cursor() as cursor:
        for _ in range(runs):
            began = time.perf_counter()
            cursor.execute(sql)
            cursor.fetchall()
            times.append(time.perf_counter() - began)
    return times


def machine_facts() -> dict[str, Any]:
    import django
    import psycopg
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        version = cursor.fetchone()[0].split(" on ")[0]
        cursor.execute(
            "SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name IN "
            "('shared_buffers', 'work_mem', 'effective_cache_size', 'random_page_cost', "
            "'max_parallel_workers_per_gather', 'autovacuum')"
        )
        settings = dict(cursor.fetchall())
        cursor.execute(
            f"SELECT pg_total_relation_size('{TABLE}'), pg_relation_size('{TABLE}'), "
            f"(SELECT reltuples FROM pg_class WHERE oid = '{TABLE}'::regclass)"
        )
        total, heap, reltuples = cursor.fetchone()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.__version__,
        "psycopg": f"{psycopg.__version__} ({psycopg.pq.__impl__})",
        "postgresql": version,
        "postgresql_settings": settings,
        "table_bytes": total,
        "heap_bytes": heap,
        "reltuples": int(reltuples),
        "code": code_version(),
    }


def summarize(seconds: list[float]) -> dict[str, float]:
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "min_ms": round(min(seconds) * 1000, 1),
    }


def measure_pages(client: Any, runs: int) -> list[dict[str, Any]]:
    found = targets()
    results = []
    for page in pages(found):
        warm = visit(client, page.url)
        if warm.status != 200:
            raise SystemExit(f"{page.url}: HTTP {warm.status}")
        visits = [visit(client, page.url) for _ in range(runs)]
        last = visits[-1]
        plans = []
        for query in last.queries:
            sql = query["sql"]
            if f'"{TABLE}"' not in sql or not sql.lstrip().upper().startswith(("SELECT", "WITH")):
                continue
            analyzed = explain(sql, analyze=True)
            plans.append(
                {
                    "sql": sql,
                    "ms": round(float(query.get("time") or 0) * 1000, 2),
                    "scans": scans(analyzed),
                    "full_table_query": full_table_query(sql),
                    "full_scans": full_scans(sql),
                    "plan": analyzed,
                }
            )
        rows_sql = row_query(last.queries)
        results.append(
            {
                "key": page.key,
                "title": page.title,
                "url": page.url,
                "status": last.status,
                **summarize([v.seconds for v in visits]),
                "runs_ms": [round(v.seconds * 1000, 1) for v in visits],
                "queries": len(last.queries),
                "sql_ms": round(statistics.median(v.sql_seconds for v in visits) * 1000, 1),
                "row_query_scans": scans(explain(rows_sql)) if rows_sql else [],
                "full_table_queries": [p["sql"] for p in plans if p["full_table_query"]],
                "full_scans": [scan for p in plans for scan in p["full_scans"]],
                "plans": plans,
            }
        )
        log(
            f"   {page.key:16s} median {results[-1]['median_ms']:8.1f} ms, max "
            f"{results[-1]['max_ms']:8.1f} ms, {len(last.queries):2d} queries"
        )
    return results


def measure_baselines(runs: int) -> dict[str, Any]:
    from django_inbox.services import collect

    columns = (
        "id, consumer, message_id, event_type, status, attempts, received_at, updated_at, "
        "next_attempt_at, last_error"
    )
    rows_sql = f"SELECT {columns} FROM {TABLE} ORDER BY id DESC LIMIT 50"
    count_sql = f"SELECT count(*) FROM {TABLE}"
    completed_sql = (
        f"SELECT consumer, count(id) FROM {TABLE} WHERE status = 'completed' GROUP BY consumer"
    )
    time_sql(count_sql, 1)  # warm the cache as the pages were
    summary_exact = []
    for _ in range(runs):
        began = time.perf_counter()
        collect(exact=True)
        summary_exact.append(time.perf_counter() - began)
    summary_estimated = []
    for _ in range(runs):
        began = time.perf_counter()
        collect(estimate_above=0)
        summary_estimated.append(time.perf_counter() - began)
    return {
        "rows_limit_50": {"sql": rows_sql, **summarize(time_sql(rows_sql, runs))},
        "count_all": {"sql": count_sql, **summarize(time_sql(count_sql, runs))},
        "count_completed": {"sql": completed_sql, **summarize(time_sql(completed_sql, runs))},
        "collect_exact": {"sql": "collect(exact=True)", **summarize(summary_exact)},
        "collect_estimated": {"sql": "collect(estimate_above=0)", **summarize(summary_estimated)},
    }


# ----------------------------------------------------------------------------- report

BASELINE_TITLES = {
    "rows_limit_50": "raw `SELECT … ORDER BY id DESC LIMIT 50` (a page's rows, nothing else)",
    "count_all": "raw `SELECT count(*)` of the whole table (a full count)",
    "count_completed": "raw count of completed rows per consumer (the summary's exact path)",
    "collect_exact": "`collect(exact=True)`: the summary with completed rows counted",
    "collect_estimated": "`collect()` with completed rows estimated (what the admin does)",
}


def render_markdown(report: dict[str, Any]) -> str:
    facts = report["facts"]
    lines = [
        "# Admin pages on a large inbox",
        "",
        f"`.venv/bin/python -m bench.admin_pages`, {facts['date']}, commit {facts['code']}: "
        f"{report['config']['rows']:,} rows ({facts['table_bytes'] / 2**20:,.0f} MiB with "
        f"indexes), each page requested {report['config']['runs']} times after one warm-up "
        "with Django's test `Client` as a logged-in superuser (the whole request: middleware, "
        "session, queries, template). Seeded in "
        f"{report['seed_seconds']:.0f} s.",
        "",
        f"Machine: {facts['nproc']} cores, load {facts['load_average_at_start']} at start, "
        f"{facts['load_average_at_end']} at end; {facts['postgresql']}, "
        f"{facts['postgresql_settings']}; Python {facts['python']}, Django {facts['django']}.",
        "",
        "| page | median ms | max ms | queries | SQL ms | row query reads | unbounded counts "
        "or DISTINCT | full scans |",
        "| --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for page in report["pages"]:
        reads = ", ".join(page["row_query_scans"]) or "-"
        lines.append(
            f"| {page['title']} (`{page['key']}`) | {page['median_ms']:,.1f} | "
            f"{page['max_ms']:,.1f} | {page['queries']} | {page['sql_ms']:,.1f} | {reads} | "
            f"{len(page['full_table_queries']) or 'none'} | "
            f"{'; '.join(page['full_scans']) or 'none'} |"
        )
    lines += [
        "",
        f"Baselines, same run and table (median / max of {report['config']['runs']}):",
        "",
        "| baseline | median ms | max ms |",
        "| --- | ---: | ---: |",
    ]
    for key, base in report["baselines"].items():
        lines.append(
            f"| {BASELINE_TITLES[key]} | {base['median_ms']:,.1f} | {base['max_ms']:,.1f} |"
        )
    lines += [
        "",
        '"row query reads" is the plan (`EXPLAIN`) of the query that fetches the page\'s rows; '
        '"unbounded counts or DISTINCT" counts the queries that count or `SELECT DISTINCT` over '
        'the table without a `LIMIT` subquery or a status of a partial index; "full scans" '
        "lists the sequential scans of the table that no `LIMIT` is expected to stop. "
        '"SQL ms" is the time Django\'s cursor spent in SQL; the rest of a page is Python '
        "(admin, templates). Every query of the last request of each page, with its "
        "`EXPLAIN (ANALYZE, BUFFERS)`, is in `admin.json`.",
        "",
        "## Slowest queries",
        "",
    ]
    queries = [
        (plan["ms"], page["key"], plan) for page in report["pages"] for plan in page["plans"]
    ]
    for ms, key, plan in sorted(queries, key=lambda q: -q[0])[:5]:
        sql = plan["sql"] if len(plan["sql"]) < 400 else plan["sql"][:400] + " …"
        lines += [f"- `{key}`, {ms:.1f} ms, reads {', '.join(plan['scans'])}:", ""]
        lines += ["  ```sql", f"  {sql}", "  ```", ""]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main


def log(text: str) -> None:
    print(text, flush=True)


def database_url() -> str:
    return os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/inbox_bench_admin")


def recreate_database(url: str, *, drop_only: bool = False) -> None:
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not parts.scheme.startswith("postgres"):
        raise SystemExit(f"{url}: the admin benchmark needs PostgreSQL")
    if not re.fullmatch(r"[A-Za-z0-9_]*bench[A-Za-z0-9_]*", name):
        # It drops the database: never one that is not obviously a benchmark's.
        raise SystemExit(f"refusing to drop {name!r}: name a database with 'bench' in it")
    maintenance = urlunsplit(("postgresql", parts.netloc, "/postgres", "", ""))
    with psycopg.connect(maintenance, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        if not drop_only:
            conn.execute(f"CREATE DATABASE {name}")


def main() -> int:
    began = time.perf_counter()
    rows = int(os.environ.get("ADMIN_BENCH_ROWS", 1_000_000))
    runs = int(os.environ.get("ADMIN_BENCH_RUNS", 5))
    keep = os.environ.get("ADMIN_BENCH_KEEP_DB", "0") not in ("", "0", "false", "no")
    url = database_url()
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("INBOX_LOG_LEVEL", "ERROR")
    recreate_database(url)
    log(f"admin pages benchmark: {url} (dropped and created), {rows:,} rows, {runs} runs")
    try:
        import django
        from django.core.management import call_command
        from django.db import connections
        from django.test import Client

        django.setup()
        call_command("migrate", verbosity=0, interactive=False)
        seed_seconds = seed(rows)
        log(f"   seeded and vacuumed in {seed_seconds:.1f} s")
        facts = machine_facts()
        client = Client(HTTP_HOST="localhost")
        login(client)
        page_results = measure_pages(client, runs)
        baselines = measure_baselines(runs)
        connections.close_all()
    finally:
        if not keep:
            recreate_database(url, drop_only=True)
    facts["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    facts["bench_seconds"] = round(time.perf_counter() - began, 1)
    report = {
        "facts": facts,
        "config": {"rows": rows, "runs": runs, "database_url": url},
        "seed_seconds": round(seed_seconds, 1),
        "pages": page_results,
        "baselines": baselines,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "admin.json").write_text(json.dumps(report, indent=2) + "\n")
    markdown = render_markdown(report)
    (RESULTS / "admin.md").write_text(markdown)
    log("\n" + markdown)
    log(
        f"wrote {RESULTS / 'admin.md'} and {RESULTS / 'admin.json'} "
        f"({facts['bench_seconds']:.0f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
