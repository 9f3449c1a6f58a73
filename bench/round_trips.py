"""Round trips per message, counted on the wire (libpq trace), and the worker's reconnect cost."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.config import log, truncate_inbox, vacuum
from bench.dedup import store_op
from bench.deliver import RawPsycopg, bare_op, deliver_op
from bench.drain import store_batch
from bench.timing import run_ops, trace_lines

# ----------------------------------------------------------------------------- round trips


def trace(fn: Callable[[], object], pgconn: Any) -> dict[str, Any]:
    """Run ``fn`` with libpq tracing on ``pgconn``; count round trips, list statements."""
    lines = trace_lines(fn, pgconn)
    round_trips = sum(1 for line in lines if line.startswith("B\t") and "\tReadyForQuery\t" in line)
    statements = []
    previous = ""
    for line in lines:
        if not line.startswith("F\t"):
            continue
        kind = line.split("\t")[2]
        if kind == "Query":
            statements.append(_shorten(line.split("\t", 3)[3]))
        elif kind == "Parse":
            statements.append(_shorten(line.split("\t", 3)[3].split('"')[3]))
        elif kind == "Bind" and previous != "Parse":
            statements.append("EXECUTE (server-side prepared)")
        previous = kind
    return {"round_trips": round_trips, "statements": statements}


def _shorten(sql: str) -> str:
    sql = re.sub(r"\s+", " ", sql.strip().strip('"'))
    first = sql.split(" ")[0].upper()
    if first in ("BEGIN", "COMMIT", "END", "ROLLBACK"):
        return first
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', sql)
    if first == "WITH" and "INSERT" in sql.upper():
        first = "WITH (INSERT"
        sql += " status)"  # the CTE form that also returns an existing row's status
    text = f"{first} {table.group(1) if table else ''}".strip()
    if "ON CONFLICT" in sql:
        text += " ON CONFLICT DO NOTHING"
    if "FOR UPDATE SKIP LOCKED" in sql:
        text += " FOR UPDATE SKIP LOCKED"
    if first == "WITH (INSERT":
        text += ") + SELECT existing status"
    return text


def round_trips() -> dict[str, Any]:
    """Round trips per operation, counted on the wire (libpq trace)."""
    from django.db import connection

    from bench.inbox_handlers import CONSUMER
    from django_inbox.processing.attempts import process_claimed
    from django_inbox.processing.claims import claim_batch
    from django_inbox.processing.worker import Worker

    log("\n== round trips per message, counted on the wire (libpq trace)")
    truncate_inbox()
    k = 20
    out: dict[str, Any] = {}

    def record(name: str, op: Callable[[int], object], pgconn: Any, warm: int = 0) -> None:
        for i in range(warm):
            op(10**6 + i)
        one = trace(lambda: op(0), pgconn)
        many = trace(lambda: run_ops(op, k, start=1), pgconn)
        out[name] = {
            "round_trips_per_message": many["round_trips"] / k,
            "statements": one["statements"],
        }

    connection.ensure_connection()
    pg = connection.connection.pgconn
    record("deliver", deliver_op("t"), pg, warm=5)
    record("duplicate_deliver", deliver_op("t", "duplicate"), pg)
    record("bare_django", bare_op, pg, warm=5)
    record("store_single", store_op("ts"), pg, warm=5)
    raw = RawPsycopg()
    record("raw_psycopg", raw.update_op, raw.conn.pgconn, warm=10)
    raw.close()

    # The drain: one run_once() claims a batch of 100 and processes it; the statements are
    # listed from one claim and one processed message.
    truncate_inbox()
    store_batch(None, "tw", 300)
    worker = Worker(consumers=[CONSUMER], until_idle=0)
    worker.run_once()  # warm
    connection.ensure_connection()
    pg = connection.connection.pgconn
    batch = trace(worker.run_once, pg)
    claimed: list[Any] = []
    claim = trace(lambda: claimed.extend(claim_batch(CONSUMER, 100)), pg)
    one = trace(lambda: process_claimed(claimed[0]), pg)
    out["drain"] = {
        "round_trips_per_message": batch["round_trips"] / 100,
        "statements": one["statements"],
        "claim_statements_per_batch_of_100": claim["statements"],
        "round_trips_per_batch_of_100": batch["round_trips"],
        "reconnects_per_batch": 1,
    }
    out["drain"].update(reconnect_cost(worker))
    for name, found in out.items():
        log(
            f"   {name:18s} {found['round_trips_per_message']:5.2f} round trips/msg: "
            f"{', '.join(found['statements'])}"
        )
    claim = ", ".join(out["drain"]["claim_statements_per_batch_of_100"])
    log(f"   drain claim, per batch of 100: {claim}")
    log(
        f"   Django connect: {out['drain']['connect_ms']} ms; a batch of 100 takes "
        f"{out['drain']['batch_of_100_on_new_connection_ms']} ms on a new connection, "
        f"{out['drain']['batch_of_100_on_warm_connection_ms']} ms on a warm one"
    )
    truncate_inbox()
    return out


def reconnect_cost(worker: Any) -> dict[str, float]:
    """What the worker's reconnect per batch costs: connect alone, and a batch of 100 on a
    fresh connection (new backend, cold caches) against one on a warm connection."""
    from django.db import connection

    pairs = 10
    truncate_inbox()
    store_batch(None, "rc", 100 * 2 * pairs)
    vacuum()
    connect_ms, cold_ms, warm_ms = [], [], []
    for _ in range(pairs):
        connection.close()
        began = time.perf_counter()
        connection.ensure_connection()
        connect_ms.append((time.perf_counter() - began) * 1e3)
        connection.close()
        began = time.perf_counter()
        worker.run_once()
        cold_ms.append((time.perf_counter() - began) * 1e3)
        began = time.perf_counter()
        worker.run_once()
        warm_ms.append((time.perf_counter() - began) * 1e3)
    return {
        "connect_ms": round(statistics.median(connect_ms), 2),
        "batch_of_100_on_new_connection_ms": round(statistics.median(cold_ms), 2),
        "batch_of_100_on_warm_connection_ms": round(statistics.median(warm_ms), 2),
    }
