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

The seed, the pages and the query checks are in ``tests/admin_pages.py``, shared with
``tests/system/test_admin_scale.py``; importing this module has no side effect: only
:func:`main` sets Django up.
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
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from bench.common import code_version
from tests.admin_pages import (
    TABLE,
    explain,
    full_scans,
    full_table_query,
    login,
    pages,
    row_query,
    scans,
    seed,
    targets,
    visit,
)

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"


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
