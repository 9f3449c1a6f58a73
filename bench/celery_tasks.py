"""Figure 11: ``@inbox_task`` against a plain ``@shared_task`` (``./scripts/bench tasks``).

One Celery worker (prefork, concurrency 2, ``acks_late``) on RabbitMQ runs, interleaved in
every run, ``BENCH_TASKS_N`` tasks (2,000) of each kind (``bench/tasks.py``): a plain
``@shared_task`` doing the benchmark's one-row UPDATE in ``transaction.atomic()``, and the
same UPDATE as an ``@inbox_task`` (its row, the UPDATE and ``completed`` in one transaction).
Tasks/s run from the first send to the moment the database shows the last UPDATE; the
worker's CPU per task (its processes together) says what limits it.

Twice, with a worker of each configuration: Celery's default, whose Django fixup closes the
database connections before and after every task (each task opens a new PostgreSQL backend),
and ``CELERY_DB_REUSE_MAX`` set, which keeps them. On a new backend the first statement on a
table pays for opening it (its catalog entries and indexes): measured here too, for the
UPDATE's table and for the inbox's, which a task on a new backend pays on top.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from bench.config import DATABASE_URL, ROOT, _env_int, bench_sql, log
from bench.timing import machine_busy, payload, server_cpu

N = _env_int("BENCH_TASKS_N", 2000)
RUNS = _env_int("BENCH_TASKS_RUNS", 5)
BROKER = os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
TARGET = 0.8
KINDS = {"plain": "bench.plain_take", "inbox": "bench.inbox_take"}
#: Worker configurations: Celery's default (a connection per task), connections kept.
CONFIGS = {"default": None, "kept": "1000"}
FRESH_SAMPLES = 40


def _total_qty() -> int:
    """The stock left, through this process's Django connection (kept open: a new connection
    per poll would cost PostgreSQL more than the tasks measured)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT sum(qty) FROM shop_stock")
        return int(cursor.fetchone()[0])


def _timed(app: Any, queue: str, worker_pid: int, task: str) -> dict[str, float]:
    start_qty = _total_qty()
    cpu, busy, began = server_cpu(worker_pid), machine_busy(), time.perf_counter()
    with app.producer_or_acquire() as producer:
        for i in range(N):
            app.send_task(
                task, (payload(i)["sku"],), queue=queue, producer=producer,
                headers={"idempotency_key": f"{task}-{uuid.uuid4().hex}"},
            )  # fmt: skip
    deadline = time.monotonic() + 600
    while _total_qty() > start_qty - N:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{task}: the worker did not finish {N} tasks in 600 s")
        time.sleep(0.1)
    elapsed = time.perf_counter() - began
    return {
        "per_s": N / elapsed,
        "worker_cpu_us": (server_cpu(worker_pid) - cpu) / N * 1e6,
        "machine_busy": (machine_busy() - busy) / (elapsed * (os.cpu_count() or 1)),
    }


def _fresh_connection_costs() -> dict[str, float]:
    """Median µs of the first and second statement on a new connection: the UPDATE of the
    tasks, and the inbox's insert (the statement ``deliver()`` sends, in autocommit)."""
    import psycopg

    from bench.config import DATABASE_URL as url
    from bench.timing import payload as make

    sku = make(0)["sku"]
    insert = (
        "INSERT INTO django_inbox_inboxmessage (consumer, message_id, source, event_type, key, "
        "payload, headers, status, attempts, received_at, updated_at, history, last_error, "
        "rerun, skip_requested, lease_id) VALUES ('bench-fresh', %s, '', 't', '', '{}', '{}', "
        "'completed', 1, now(), now(), '[]', '', false, false, '') ON CONFLICT DO NOTHING"
    )
    update = "UPDATE shop_stock SET qty = qty - 1 WHERE sku = %s"
    found: dict[str, float] = {}
    for name, sql in (("update", update), ("insert", insert)):
        first, second = [], []
        for _ in range(FRESH_SAMPLES):
            with psycopg.connect(url, autocommit=True) as raw:
                for times in (first, second):
                    began = time.perf_counter()
                    raw.execute(sql, [sku if name == "update" else uuid.uuid4().hex])
                    times.append(time.perf_counter() - began)
        found[f"{name}_first_us"] = statistics.median(first) * 1e6
        found[f"{name}_second_us"] = statistics.median(second) * 1e6
    bench_sql("DELETE FROM django_inbox_inboxmessage WHERE consumer = 'bench-fresh'")
    return found


def _worker(queue: str, reuse: str | None) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DATABASE_URL": DATABASE_URL,
        "BENCH_CONN_MAX_AGE": "none",
        "CELERY_BROKER_URL": BROKER,
        "CELERY_RESULT_BACKEND": "",
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
    }
    if reuse is not None:
        env["BENCH_CELERY_DB_REUSE_MAX"] = reuse
    return subprocess.Popen(
        [
            sys.executable, "-m", "celery", "-A", "testproject.celery", "worker", "-Q", queue,
            "--include", "bench.tasks", "--concurrency", "2", "--pool", "prefork",
            "--without-gossip", "--without-mingle", "--loglevel", "WARNING",
        ],
        env=env,
        cwd=ROOT / "testproject",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip


def bench_tasks() -> dict[str, Any]:
    from testproject.celery import app

    queue = f"bench-tasks-{uuid.uuid4().hex[:8]}"
    app.conf.update(broker_url=BROKER, result_backend=None, task_default_queue=queue)
    log(f"11. Celery tasks: {N} tasks x {RUNS} runs of each kind, one worker (prefork, 2)")
    fresh = _fresh_connection_costs()
    configs: dict[str, Any] = {}
    try:
        for config, reuse in CONFIGS.items():
            worker = _worker(queue, reuse)
            runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
            try:
                time.sleep(5)  # the worker's start-up
                for task in KINDS.values():  # warm-up
                    _timed(app, queue, worker.pid, task)
                for run in range(RUNS):
                    for kind, task in KINDS.items():
                        found = _timed(app, queue, worker.pid, task)
                        runs[kind].append(found)
                        log(f"   {config:7} run {run + 1} {kind:6} {found['per_s']:7.0f} tasks/s")
                    bench_sql("VACUUM (ANALYZE) django_inbox_inboxmessage, shop_stock")
            finally:
                os.killpg(worker.pid, 9)
                worker.wait()
            medians = {
                kind: {key: statistics.median(r[key] for r in found) for key in found[0]}
                for kind, found in runs.items()
            }
            configs[config] = {
                "medians": medians,
                "all_runs": runs,
                "ratio": medians["inbox"]["per_s"] / medians["plain"]["per_s"],
            }
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    return {"tasks": N, "runs": RUNS, "configs": configs, "fresh": fresh, "target": TARGET}


def render_tasks(data: dict[str, Any]) -> str:
    said = {
        "default": "Celery's default (a new connection per task)",
        "kept": "`CELERY_DB_REUSE_MAX = 1000` (connections kept)",
    }
    rows = []
    for config, found in data["configs"].items():
        for kind, label in (("plain", "plain `@shared_task`"), ("inbox", "`@inbox_task`")):
            m = found["medians"][kind]
            rows.append(
                f"| {said[config]} | {label} | {m['per_s']:,.0f} | {m['worker_cpu_us']:,.0f} µs "
                f"| {m['machine_busy']:.0%} |"
            )
    ratios = "; ".join(
        f"{said[config]}: **{found['ratio']:.2f}** "
        f"({'reached' if found['ratio'] >= data['target'] else 'missed'})"
        for config, found in data["configs"].items()
    )
    fresh = data["fresh"]
    return "\n".join(
        [
            "## 11. Celery tasks: `@inbox_task` against a plain `@shared_task`",
            "",
            f"One worker (prefork, concurrency 2, `acks_late`) on RabbitMQ; {data['tasks']} "
            f"tasks per run, median of {data['runs']} interleaved runs; each task one "
            "single-row UPDATE. Once with Celery's default, whose Django fixup closes the "
            "database connections around every task, once with them kept.",
            "",
            "| worker | task | tasks/s | worker CPU per task | machine busy |",
            "| --- | --- | ---: | ---: | ---: |",
            *rows,
            "",
            f"inbox / plain (target {data['target']:.2f}): {ratios}.",
            "",
            "What limits it: with a new connection per task, PostgreSQL opens each table a "
            "task touches on the new backend at its first statement (catalog entries, "
            f"indexes): measured here, the UPDATE {fresh['update_first_us']:,.0f} µs on a new "
            f"connection against {fresh['update_second_us']:,.0f} µs on the next, the inbox's "
            f"insert {fresh['insert_first_us']:,.0f} µs against "
            f"{fresh['insert_second_us']:,.0f} µs. An inbox task touches two tables, so it "
            "pays that twice; with connections kept neither pays it, and what is left is the "
            "inbox's insert and its Python, against Celery's own per-task cost (receiving, "
            "the prefork hand-off, acknowledging) that both pay.",
            "",
        ]
    )
