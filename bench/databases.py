#!/usr/bin/env python
"""Section 9: the database families side by side, in one run (``./scripts/bench-databases``).

For PostgreSQL and MariaDB in turn, each in a subprocess of its own against a fresh database
(``test_inbox_bench_db``, created, migrated and dropped by Django's test-database machinery):

- ``deliver()`` of new messages, one transaction each, over the same handler (one single-row
  UPDATE) in a bare ``transaction.atomic()``;
- the drain: ``store()`` N messages in one transaction, then ``Worker.run()`` in process, over
  the same bare ``atomic()`` loop of N handler calls.

Runs alternate (baseline, inbox, baseline, …) and each figure is the median of ``RUNS``.

Then, on MariaDB, the plans of the inbox's statements at ``BENCH_PLAN_ROWS`` rows (1,000,000;
``bench/plans_mariadb.py``): none may read a table whole.

Run ``python -m bench.databases`` from the project's root (``./scripts/bench-databases``).
Writes ``bench/results/databases.json`` and ``databases.md``; exits 1 if a statement read a
table whole.
Knobs: ``BENCH_DB_N`` (2000) messages per run, ``BENCH_DB_RUNS`` (3), ``BENCH_PLAN_ROWS``,
``BENCH_POSTGRES_URL``, ``BENCH_MARIADB_URL``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.plans_mariadb import empty_inbox, log, plan_report, plans

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
N = int(os.environ.get("BENCH_DB_N", "2000"))
RUNS = int(os.environ.get("BENCH_DB_RUNS", "3"))
PLAN_ROWS = int(os.environ.get("BENCH_PLAN_ROWS", "1000000"))
URLS = {
    "PostgreSQL": os.environ.get(
        "BENCH_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/inbox_bench_db"
    ),
    "MariaDB": os.environ.get("BENCH_MARIADB_URL", "mysql://root@127.0.0.1:3306/inbox_bench_db"),
}
SKUS = 50


# ------------------------------------------------------------------------- in the child


def setup(url: str) -> str:
    """Configure Django on ``url`` and create the benchmark's database; its old name."""
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    sys.path[:0] = [str(ROOT / "testproject"), str(ROOT)]
    import django

    django.setup()
    from django.db import connection

    old = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    from shop.models import Stock

    Stock.objects.bulk_create(Stock(sku=f"sku-{i}", qty=10**9) for i in range(SKUS))
    return str(old)


def take(i: int) -> None:
    """The handler's body (``bench.inbox_handlers.take_one``), run bare."""
    from django.db.models import F
    from shop.models import Stock

    Stock.objects.filter(sku=f"sku-{i % SKUS}").update(qty=F("qty") - 1)


def timed(op: Any, count: int) -> float:
    began = time.perf_counter()
    for i in range(count):
        op(i)
    return count / (time.perf_counter() - began)


def throughput() -> dict[str, Any]:
    from django.db import transaction

    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import deliver, store
    from django_inbox.processing.worker import Worker

    def bare(i: int) -> None:
        with transaction.atomic():
            take(i)

    rates: dict[str, list[float]] = {"bare": [], "deliver": [], "drain": [], "bare_loop": []}
    timed(bare, 200)  # warm up
    for run in range(RUNS):
        rates["bare"].append(timed(bare, N))

        def one(i: int, run: int = run) -> None:
            deliver(
                consumer=CONSUMER,
                message_id=f"d{run}-{i}",
                event_type=EVENT_TYPE,
                payload={"sku": f"sku-{i % SKUS}"},
            )

        rates["deliver"].append(timed(one, N))
        empty_inbox()
        with transaction.atomic():
            for i in range(N):
                store(
                    consumer=CONSUMER,
                    message_id=f"s{run}-{i}",
                    event_type=EVENT_TYPE,
                    payload={"sku": f"sku-{i % SKUS}"},
                )
        began = time.perf_counter()
        stats = Worker(consumers=[CONSUMER], until_idle=0).run()
        rates["drain"].append(N / (time.perf_counter() - began))
        assert stats.outcomes["processed"] == N, stats
        empty_inbox()
        rates["bare_loop"].append(timed(bare, N))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "rates": rates,
        "medians": medians,
        "deliver_over_bare": medians["deliver"] / medians["bare"],
        "drain_over_bare": medians["drain"] / medians["bare_loop"],
    }


def child(name: str, url: str) -> None:
    old = setup(url)
    from django.db import connection

    try:
        result: dict[str, Any] = {"database": name, "version": connection.get_database_version()}
        log(f"== {name} {result['version']}: {RUNS} runs x {N} messages")
        result.update(throughput())
        log(
            f"   deliver/bare {result['deliver_over_bare']:.2f}  "
            f"drain/bare {result['drain_over_bare']:.2f}"
        )
        if connection.vendor == "mysql" and PLAN_ROWS:
            log(f"== {name}: plans at {PLAN_ROWS:,} rows")
            result["plans"] = plans(PLAN_ROWS)
        print(json.dumps(result, default=str))
    finally:
        connection.creation.destroy_test_db(old, verbosity=0)


# ------------------------------------------------------------------------- in the parent


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        "# Databases side by side",
        "",
        f"{N} messages per run, median of {RUNS} runs; the handler is one single-row UPDATE.",
        "",
        "| Database | bare atomic() msg/s | deliver() msg/s | deliver/bare | "
        "bare loop msg/s | drain msg/s | drain/bare |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r["medians"]
        lines.append(
            f"| {r['database']} {'.'.join(map(str, r['version']))} | {m['bare']:,.0f} | "
            f"{m['deliver']:,.0f} | {r['deliver_over_bare']:.2f} | {m['bare_loop']:,.0f} | "
            f"{m['drain']:,.0f} | {r['drain_over_bare']:.2f} |"
        )
    for r in results:
        if "plans" in r:
            lines += plan_report(r["database"], r["plans"])
    return "\n".join(lines) + "\n"


def main() -> int:
    results = []
    for name, url in URLS.items():
        proc = subprocess.run(
            [sys.executable, "-m", "bench.databases", "--child", name, url],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        if proc.returncode != 0:
            log(f"{name} failed (exit {proc.returncode})")
            return 1
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "databases.json").write_text(json.dumps(results, indent=1, default=str))
    text = report(results)
    (RESULTS / "databases.md").write_text(text)
    print(text)
    whole = [s for r in results for s in r.get("plans", {}).get("statements", []) if s["whole"]]
    return 1 if whole else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
