#!/usr/bin/env python
"""Benchmark suite of django-transactional-inbox. Run it with ``./scripts/bench``.

Measures, in one run on this machine, against a database of its own (``inbox_bench``,
dropped and created here, dropped again at the end unless ``BENCH_KEEP_DB=1``):

1. ``deliver()`` throughput in one process, beside baselines running the same single-row
   UPDATE: the handler in a bare ``transaction.atomic()``, raw psycopg, pgbench.
2. ``inbox_process`` drain throughput: ``store()`` N messages, drain them with the real
   worker in process and as ``manage.py inbox_process`` subprocesses (one, then two).
   2c. The command (start-up included), a bare ``atomic()`` loop with the same handler and
   procrastinate (pinned, in ``.bench-venv/procrastinate``) running the same UPDATE, on the
   same number of messages, interleaved.
3. Duplicate rejection: ``deliver()`` of already-completed ids, against the raw psycopg floor
   (one prepared ``INSERT … ON CONFLICT`` in autocommit), and new/duplicate alternating.
4. ``store()`` of new messages, one per transaction.
5. Broker consumers: RabbitMQ → ``manage.py inbox_consume`` → the handler → ack, against a
   plain kombu consumer (``bench/consume.py``) running the same handler in
   ``transaction.atomic()``; for information ``--ack after-store``, prefetch 1,
   ``CONN_MAX_AGE=0`` and Redis. Each consumer is a subprocess; its rate runs from its first
   to its last message, and its CPU and its PostgreSQL backend's are sampled from ``/proc``.
   Profiled (untimed) with py-spy and cProfile.

Beside them, for the analysis: the inbox with an empty handler, with Django's prepared
statements on, and the drain with a persistent connection. Every timed run also records the
CPU time of this process (client), of its PostgreSQL backend (server, from ``/proc``) and of
the whole machine, so a figure splits into client CPU, server CPU and waiting, and shows
whether other work shared the cores. Then it counts round trips per operation on the wire
(libpq trace), times the worker's reconnects, profiles ``deliver()`` and the drain with
cProfile, and writes ``bench/results/latest.json`` and ``latest.md``. Then:

8. The outbox (``bench/outbox.py``): a business transaction with and without ``publish()``;
   the relay against a plain kombu producer with confirms; the relay's lag (written → sent)
   under a steady 1,000 rows/s.

6. Storage and dedup by table size: bytes per row (heap, TOAST, each index) at 1,000,000 and
   ``BENCH_SCALE_ROWS`` completed rows, and the duplicate rate there against 10,000 rows.
7. Memory: ``inbox_consume``'s RSS with a ``BENCH_MEMORY_BACKLOG`` backlog at prefetch 100,
   and with 150 messages of ``BENCH_MEMORY_LARGE_BYTES``, against prefetch x size + 60 MiB.

Knobs (environment): ``BENCH_N`` messages per timed run (5000), ``BENCH_RUNS`` runs per
figure (3; the median is reported), ``BENCH_DRAIN_N`` messages per drain (100000),
``BENCH_DRAIN_RUNS`` in-process drain runs (3), ``BENCH_PGBENCH_SECONDS`` (10),
``BENCH_KEEP_DB`` (0: drop ``inbox_bench`` at the end), ``BENCH_CONSUME_N`` messages per
consumer run (20000), ``BENCH_CONSUME_RUNS`` (``BENCH_RUNS``), ``BENCH_RABBITMQ_URL``,
``BENCH_REDIS_URL``, ``BENCH_DB`` (the database's name, ``inbox_bench``),
``BENCH_SCALE_ROWS`` (10,000,000), ``BENCH_MEMORY_BACKLOG`` (1,000,000),
``BENCH_MEMORY_SECONDS`` (60), ``BENCH_MEMORY_LARGE_BYTES`` (10 MiB).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if sys.path and Path(sys.path[0] or ".").resolve() == BENCH_DIR:
    sys.path.pop(0)  # import bench.* as a package, never its modules as top-level ones
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]

from bench.config import (
    BROKERS,
    CONSUME_N,
    CONSUME_PROFILE_N,
    CONSUME_RUNS,
    DB_NAME,
    DRAIN_N,
    DRAIN_RUNS,
    KEEP_DB,
    PGBENCH_SECONDS,
    RESULTS,
    RUNS,
    TARGETS,
    WARMUP,
    N,
    drop_database,
    loadavg,
    log,
    machine_facts,
    recreate_database,
    seed_stock,
    setup_django,
)
from bench.consuming import bench_consume
from bench.dedup import bench_duplicates, bench_store
from bench.deliver import bench_deliver, bench_pgbench
from bench.drain import bench_drain
from bench.drain_compared import bench_drain_compared
from bench.memory import bench_memory
from bench.ordered import bench_ordered
from bench.outbox import bench_outbox
from bench.profiles import profiles
from bench.round_trips import round_trips
from bench.scale import bench_scale
from bench.timing import Series

# ----------------------------------------------------------------------------- main


def _section(name: str, run: Any) -> dict[str, Any]:
    """A section that ends the run's report, not the run, if it fails: the report says why."""
    try:
        return dict(run())
    except Exception as exc:
        log(f"   {name} failed: {type(exc).__name__}: {exc}")
        return {"skipped": f"failed: {type(exc).__name__}: {exc}"}


#: Sections that can run alone (``./scripts/bench scale``): each writes
#: ``bench/results/<name>.json`` and ``<name>.md`` and leaves ``latest.*`` as they are.
ALONE = {
    "scale": ("bench.scale", "bench_scale", "render_scale"),
    "memory": ("bench.memory", "bench_memory", "render_memory"),
    "waiting": ("bench.waiting", "bench_waiting", "render_waiting"),
    "webhooks": ("bench.webhooks", "bench_webhooks", "render_webhooks"),
    "tasks": ("bench.celery_tasks", "bench_tasks", "render_tasks"),
    "transports": ("bench.transports", "bench_transports", "render_transports"),
    "tombstones": ("bench.tombstones", "bench_tombstones", "render_tombstones"),
    "hosts": ("bench.hosts", "bench_hosts", "render_hosts"),
}


def alone(names: list[str]) -> int:
    """Run only the named sections (a full run takes 25-40 minutes)."""
    import importlib
    import json

    unknown = sorted(set(names) - set(ALONE))
    if unknown:
        log(f"unknown section(s) {unknown}: choose among {sorted(ALONE)}, or none for all")
        return 2
    recreate_database()
    try:
        setup_django()
        seed_stock()
        for name in names:
            module, run, render = ALONE[name]
            loaded = importlib.import_module(module)
            began = time.perf_counter()
            data = _section(name, getattr(loaded, run))
            facts = {**machine_facts(), "bench_seconds": round(time.perf_counter() - began, 1)}
            document = {"facts": facts, name: data}
            (RESULTS / f"{name}.json").write_text(json.dumps(document, indent=2) + "\n")
            text = (
                f"# django-transactional-inbox benchmark: {name} alone\n\n"
                f"Command: `./scripts/bench {name}` · {facts['date']} · "
                f"{facts['bench_seconds']:.0f} s · {facts['postgresql']} · "
                f"code measured: {facts.get('code', 'unknown')}.\n\n"
                + getattr(loaded, render)(data)
            )
            (RESULTS / f"{name}.md").write_text(text)
            log("\n" + text + f"\nwrote {RESULTS / name}.json and .md")
    finally:
        if not KEEP_DB:
            drop_database()
    return 0


def main() -> int:
    if sys.argv[1:]:
        return alone(sys.argv[1:])
    began = time.perf_counter()
    log(
        f"inbox benchmark: database {DB_NAME} (dropped and created), N={N}, runs={RUNS}, "
        f"drain N={DRAIN_N}"
    )
    recreate_database()
    try:
        setup_django()
        seed_stock()
        facts = machine_facts()
        log(
            f"   {facts['nproc']} cores, load {facts['load_average_at_start']}, "
            f"{facts['postgresql']}, {facts['postgresql_settings']}"
        )
        figures: dict[str, Series] = {}
        figures.update(bench_deliver())
        figures.update(bench_duplicates())
        figures.update(bench_pgbench())
        figures.update(bench_store())
        figures.update(bench_drain())
        figures.update(bench_drain_compared())
        figures.update(bench_ordered())
        figures.update(bench_outbox())
        consume_figures, consume = bench_consume()
        figures.update(consume_figures)
        wire = round_trips()
        prof = profiles()
        memory = _section("memory", bench_memory)
        scale = _section("scale", bench_scale)  # last: it leaves millions of rows behind
    finally:
        if not KEEP_DB:
            drop_database()
    facts["load_average_at_end"] = loadavg()
    facts["bench_seconds"] = round(time.perf_counter() - began, 1)
    from bench.report import write_report

    table = write_report(
        RESULTS,
        facts=facts,
        config={
            "BENCH_N": N,
            "BENCH_RUNS": RUNS,
            "warmup": WARMUP,
            "BENCH_DRAIN_N": DRAIN_N,
            "BENCH_DRAIN_RUNS": DRAIN_RUNS,
            "BENCH_PGBENCH_SECONDS": PGBENCH_SECONDS,
            "BENCH_CONSUME_N": CONSUME_N,
            "BENCH_CONSUME_RUNS": CONSUME_RUNS,
            "consume_profile_n": CONSUME_PROFILE_N,
            "brokers": BROKERS,
        },
        targets=TARGETS,
        figures={key: value.as_dict() for key, value in figures.items()},
        round_trips=wire,
        profiles=prof,
        consume=consume,
        memory=memory,
        scale=scale,
    )
    log("\n" + table)
    log(
        f"\nwrote {RESULTS / 'latest.json'} and {RESULTS / 'latest.md'} "
        f"({facts['bench_seconds']:.0f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
