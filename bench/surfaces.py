#!/usr/bin/env python
"""What an operator reads during an incident, timed on large tables: the health view, the
``inbox_stats`` command, the Prometheus collector, the admin's changelist (with its summary),
its ``key:`` and ``source:`` searches, the failure groups page and the confirmation page of a
bulk action over "select all".

Run it with one command::

    .venv/bin/python -m bench.surfaces

For each scenario of ``SURFACES_BENCH_SCENARIOS`` (``ROWS/BACKLOG`` pairs, default
``10000/1500,1000000/1500,1500000/500000,5000000/1500,10000000/1500``) it creates (drops
first) the database named in ``DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/inbox_bench_surfaces``; its name must contain ``bench``),
migrates it, fills it with ``tests.admin_pages.seed_sql`` (``BACKLOG`` of the newest rows
received), runs ``VACUUM (ANALYZE)``, and times each surface ``SURFACES_BENCH_RUNS`` times (5)
after one warm-up. Baselines of the same run and table: a bare ``SELECT 1``, a ``count(*)``
of the whole table and of the rows still to process (what an exact answer costs). It writes
``bench/results/surfaces.md`` and ``.json`` and drops the database.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.admin_pages import database_url, log, machine_facts, recreate_database
from bench.common import code_version

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
TABLE = "django_inbox_inboxmessage"
DEFAULT_SCENARIOS = "10000/1500,1000000/1500,1500000/500000,5000000/1500,10000000/1500"
#: The issue's goals: well under 0.1 s at 1.5M rows with a backlog of 500k, under 0.5 s at
#: 5M and 10M rows.
GOAL_MS = {(1_500_000, 500_000): 100.0, 5_000_000: 500.0, 10_000_000: 500.0}


def scenarios() -> list[tuple[int, int]]:
    text = os.environ.get("SURFACES_BENCH_SCENARIOS", DEFAULT_SCENARIOS)
    found = []
    for item in text.split(","):
        rows, _, backlog = item.strip().partition("/")
        found.append((int(rows), int(backlog or 1500)))
    return found


def surfaces() -> dict[str, tuple[str, Callable[[], Any]]]:
    """Each surface: its title and a call that answers it once (the whole request for views)."""
    from django.core.management import CommandError, call_command
    from django.test import Client, RequestFactory
    from django.urls import reverse

    from django_inbox.contrib.health import health_view
    from django_inbox.contrib.prometheus import StatsCollector
    from django_inbox.models import InboxMessage
    from tests.admin_pages import login

    client = Client(HTTP_HOST="localhost")
    login(client)
    factory = RequestFactory()
    changelist = reverse("admin:django_inbox_inboxmessage_changelist")
    groups = reverse("admin:django_inbox_inboxmessage_groups")
    newest = InboxMessage.objects.order_by("-pk").values_list("pk", flat=True).first()

    def get(url: str) -> Callable[[], Any]:
        def call() -> Any:
            response = client.get(url)
            if response.status_code != 200:
                raise SystemExit(f"{url}: HTTP {response.status_code}")

        return call

    def confirm_select_all() -> None:
        response = client.post(
            f"{changelist}?status__exact=completed",
            {
                "action": "force_rerun_messages",
                "select_across": "1",
                "index": "0",
                "_selected_action": [str(newest)],
            },
        )
        if response.status_code != 200 or b"reason" not in response.content:
            raise SystemExit(f"confirmation page: HTTP {response.status_code}")

    def command(*args: str) -> Callable[[], Any]:
        def call() -> None:
            try:
                call_command("inbox_stats", *args, stdout=io.StringIO())
            except CommandError as exc:  # it exits 1 when it finds problems, as here
                if exc.returncode != 1:
                    raise

        return call

    return {
        "health": ("health view", lambda: health_view(factory.get("/health"))),
        "health_consumer": (
            "health view, ?consumer=payments",
            lambda: health_view(factory.get("/health", {"consumer": "payments"})),
        ),
        "inbox_stats": ("`inbox_stats`", command()),
        "inbox_stats_json": ("`inbox_stats --json`", command("--json")),
        "inbox_stats_exact": ("`inbox_stats --exact` (counts every row)", command("--exact")),
        "prometheus": ("Prometheus collector (a scrape)", lambda: list(StatsCollector().collect())),
        "changelist": ("admin changelist with its summary", get(changelist)),
        "key_search": (
            "admin search `key:customer-4242`",
            get(f"{changelist}?q=key:customer-4242"),
        ),
        "key_missing": (
            "admin search `key:` of a key no row has",
            get(f"{changelist}?q=key:nobody"),
        ),
        "source_search": (
            "admin search `source:` of a source no row has",
            get(f"{changelist}?q=source:nobody"),
        ),
        "groups": ("admin failure groups page", get(groups)),
        "confirm_select_all": (
            "force re-run confirmation, all completed rows selected",
            confirm_select_all,
        ),
    }


def time_call(call: Callable[[], Any], runs: int) -> dict[str, Any]:
    call()  # warm-up
    seconds = []
    for _ in range(runs):
        began = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - began)
    return {
        "median_ms": round(statistics.median(seconds) * 1000, 1),
        "max_ms": round(max(seconds) * 1000, 1),
        "runs_ms": [round(s * 1000, 1) for s in seconds],
    }


def baselines(runs: int) -> dict[str, Any]:
    from django.db import connection

    queries = {
        "select_1": "SELECT 1",
        "count_all": f"SELECT count(*) FROM {TABLE}",
        "count_backlog": (
            f"SELECT count(*) FROM {TABLE} WHERE status IN ('received', 'failed', 'in_progress')"
        ),
    }
    found = {}
    with connection.cursor() as cursor:
        for key, sql in queries.items():

            def run(sql: str = sql) -> None:
                cursor.execute(sql)
                cursor.fetchall()

            found[key] = {"sql": sql, **time_call(run, runs)}
    return found


def run_scenario(url: str, rows: int, backlog: int, runs: int) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import connections

    from tests.admin_pages import seed

    connections.close_all()
    recreate_database(url)
    call_command("migrate", verbosity=0, interactive=False)
    seed_seconds = seed(rows, backlog=backlog)
    log(f"== {rows:,} rows, backlog {backlog:,}: seeded and vacuumed in {seed_seconds:.0f} s")
    facts = machine_facts()
    results = {}
    for key, (title, call) in surfaces().items():
        results[key] = {"title": title, **time_call(call, runs)}
        log(
            f"   {key:20s} median {results[key]['median_ms']:8.1f} ms, "
            f"max {results[key]['max_ms']:8.1f}"
        )
    return {
        "rows": rows,
        "backlog": backlog,
        "seed_seconds": round(seed_seconds, 1),
        "table_bytes": facts["table_bytes"],
        "facts": facts,
        "surfaces": results,
        "baselines": baselines(runs),
    }


def goal_of(rows: int, backlog: int) -> float | None:
    return GOAL_MS.get((rows, backlog)) or (GOAL_MS.get(rows) if backlog <= 1500 else None)


def render_markdown(report: dict[str, Any]) -> str:
    points = report["scenarios"]
    first = points[0]["facts"]
    heads = [f"{p['rows']:,} rows, backlog {p['backlog']:,}" for p in points]
    lines = [
        "# Surfaces in an incident: health, stats, metrics and the admin on large tables",
        "",
        f"`.venv/bin/python -m bench.surfaces`, {report['date']}, commit {report['code']}; "
        f"median (max) ms of {report['runs']} calls after one warm-up, the whole call (views "
        "through Django's test client or the view function, commands through `call_command`). "
        f"{first['postgresql']}, {first['postgresql_settings']}; Python {first['python']}, "
        f"Django {first['django']}; {first['nproc']} cores.",
        "",
        "| surface | " + " | ".join(heads) + " |",
        "| --- |" + " ---: |" * len(points),
    ]
    for key, surface in points[0]["surfaces"].items():
        cells = []
        for point in points:
            timing = point["surfaces"][key]
            goal = goal_of(point["rows"], point["backlog"])
            mark = ""
            if goal is not None and key != "inbox_stats_exact":
                mark = " ✓" if timing["median_ms"] < goal else " ✗"
            cells.append(f"{timing['median_ms']:,.1f} ({timing['max_ms']:,.1f}){mark}")
        lines.append(f"| {surface['title']} | " + " | ".join(cells) + " |")
    lines += ["", "Baselines, same tables:", "", "| baseline | " + " | ".join(heads) + " |"]
    lines.append("| --- |" + " ---: |" * len(points))
    for key, base in points[0]["baselines"].items():
        cells = [
            f"{p['baselines'][key]['median_ms']:,.1f} ({p['baselines'][key]['max_ms']:,.1f})"
            for p in points
        ]
        lines.append(f"| `{base['sql']}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Goals: under 100 ms at 1.5M rows with a backlog of 500k, under 500 ms at 5M and 10M "
        "rows (✓ met, ✗ not); `inbox_stats --exact` counts every row on purpose and has none.",
        "Seeded tables: "
        + ", ".join(
            f"{p['rows']:,} rows {p['table_bytes'] / 2**20:,.0f} MiB in {p['seed_seconds']:.0f} s"
            for p in points
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    import datetime as dt

    runs = int(os.environ.get("SURFACES_BENCH_RUNS", 5))
    url = os.environ.get("DATABASE_URL") or database_url().replace("admin", "surfaces")
    sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    os.environ.setdefault("INBOX_LOG_LEVEL", "ERROR")
    recreate_database(url)
    import django

    django.setup()
    points = []
    try:
        for rows, backlog in scenarios():
            points.append(run_scenario(url, rows, backlog, runs))
    finally:
        from django.db import connections

        connections.close_all()
        recreate_database(url, drop_only=True)
    report = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "code": code_version(),
        "runs": runs,
        "scenarios": points,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "surfaces.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (RESULTS / "surfaces.md").write_text(render_markdown(report))
    log(render_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
