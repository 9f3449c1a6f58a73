"""Procrastinate draining the same work, for figure 2c: run in its own virtualenv
(``.bench-venv/procrastinate``, made by ``./scripts/bench`` with a pinned procrastinate) as

    python bench/procrastinate_drain.py DSN COUNT

It applies procrastinate's schema to the benchmark database (once; its tables live beside the
inbox's), defers COUNT jobs in one batch (not timed), then runs one worker (concurrency 1,
polling, no LISTEN/NOTIFY wait, finished jobs deleted as the inbox keeps its rows small)
until the queue is empty, and prints one JSON line: ``{"jobs": COUNT, "seconds": …}``. Each
job runs the handler's statement, the single-row stock UPDATE, on a connection of its own in
autocommit: one transaction for the UPDATE, and procrastinate's own statements to fetch and
finish the job.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from typing import Any

import procrastinate
import psycopg

UPDATE = "UPDATE shop_stock SET qty = qty - 1 WHERE sku = %s"
QUEUE = "bench"


def make_app(dsn: str) -> tuple[Any, dict[str, Any]]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))
    state: dict[str, Any] = {}

    @app.task(name="bench_take", queue=QUEUE)
    async def take(sku: str) -> None:
        await state["conn"].execute(UPDATE, (sku,))

    return app, {"task": take, "state": state}


async def drain(dsn: str, count: int) -> dict[str, Any]:
    app, parts = make_app(dsn)
    async with app.open_async():
        with psycopg.connect(dsn, autocommit=True) as conn:
            found = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
            applied = bool(found and found[0])
            if applied:
                conn.execute("DELETE FROM procrastinate_jobs")
        if not applied:
            await app.schema_manager.apply_schema_async()
        jobs = [{"sku": f"BENCH-{i % 10_000}"} for i in range(count)]
        await parts["task"].batch_defer_async(*jobs)
        parts["state"]["conn"] = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        try:
            began = time.perf_counter()
            await app.run_worker_async(
                queues=[QUEUE],
                concurrency=1,
                wait=False,
                listen_notify=False,
                install_signal_handlers=False,
                delete_jobs="successful",
            )
            seconds = time.perf_counter() - began
        finally:
            await parts["state"]["conn"].close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM procrastinate_jobs").fetchone()
            left = int(row[0]) if row else -1
    return {"jobs": count, "seconds": seconds, "left": left, "version": procrastinate.__version__}


if __name__ == "__main__":
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    print(json.dumps(asyncio.run(drain(sys.argv[1], int(sys.argv[2])))), flush=True)
