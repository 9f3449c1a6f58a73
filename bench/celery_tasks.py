"""Figure 11: ``@inbox_task`` against a plain ``@shared_task`` (``./scripts/bench tasks``).

One Celery worker (prefork, concurrency 2, ``acks_late``) on RabbitMQ runs, interleaved in
every run, ``BENCH_TASKS_N`` tasks (2,000) of each kind (``bench/tasks.py``): a plain
``@shared_task`` doing the benchmark's one-row UPDATE in ``transaction.atomic()``, and the
same UPDATE as an ``@inbox_task`` (its row, the UPDATE and ``completed`` in one transaction).
Tasks/s run from the first send to the moment the database shows the last UPDATE; the
worker's CPU per task (its processes together) says what limits it.
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


def bench_tasks() -> dict[str, Any]:
    from testproject.celery import app

    queue = f"bench-tasks-{uuid.uuid4().hex[:8]}"
    app.conf.update(broker_url=BROKER, result_backend=None, task_default_queue=queue)
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
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "testproject.celery",
            "worker",
            "-Q",
            queue,
            "--include",
            "bench.tasks",
            "--concurrency",
            "2",
            "--pool",
            "prefork",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ],
        env=env,
        cwd=ROOT / "testproject",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log(f"11. Celery tasks: {N} tasks x {RUNS} runs of each kind, one worker (prefork, 2)")
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    try:
        time.sleep(5)  # the worker's start-up
        for task in KINDS.values():  # warm-up
            _timed(app, queue, worker.pid, task)
        for run in range(RUNS):
            for kind, task in KINDS.items():
                found = _timed(app, queue, worker.pid, task)
                runs[kind].append(found)
                log(f"   run {run + 1} {kind:6} {found['per_s']:7.0f} tasks/s")
            bench_sql("VACUUM (ANALYZE) django_inbox_inboxmessage, shop_stock")
    finally:
        os.killpg(worker.pid, 9)
        worker.wait()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    medians = {
        kind: {key: statistics.median(r[key] for r in found) for key in found[0]}
        for kind, found in runs.items()
    }
    return {
        "tasks": N,
        "runs": RUNS,
        "medians": medians,
        "all_runs": runs,
        "ratio": medians["inbox"]["per_s"] / medians["plain"]["per_s"],
        "target": TARGET,
    }


def render_tasks(data: dict[str, Any]) -> str:
    medians = data["medians"]
    reached = "reached" if data["ratio"] >= data["target"] else "missed"
    plain, inbox = medians["plain"], medians["inbox"]
    return "\n".join(
        [
            "## 11. Celery tasks: `@inbox_task` against a plain `@shared_task`",
            "",
            f"One worker (prefork, concurrency 2, `acks_late`) on RabbitMQ; {data['tasks']} "
            f"tasks per run, median of {data['runs']} interleaved runs; each task one "
            "single-row UPDATE.",
            "",
            "| task | tasks/s | worker CPU per task | machine busy |",
            "| --- | ---: | ---: | ---: |",
            f"| plain `@shared_task` | {plain['per_s']:,.0f} | {plain['worker_cpu_us']:,.0f} µs "
            f"| {plain['machine_busy']:.0%} |",
            f"| `@inbox_task` | {inbox['per_s']:,.0f} | {inbox['worker_cpu_us']:,.0f} µs "
            f"| {inbox['machine_busy']:.0%} |",
            "",
            f"inbox / plain: {data['ratio']:.2f} (target {data['target']:.2f}, {reached}).",
            "",
            "What limits it: the worker's CPU per task, "
            f"{inbox['worker_cpu_us']:,.0f} µs against {plain['worker_cpu_us']:,.0f} µs: "
            "Celery's own cost (receiving, acknowledging, the prefork hand-off) is paid by "
            "both; the difference is the inbox's (its row, validation, the JSON).",
            "",
        ]
    )
