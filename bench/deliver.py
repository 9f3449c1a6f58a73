"""Figure 1: ``deliver()`` against the handler in a bare transaction, raw psycopg and pgbench."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg

from bench.config import (
    BENCH_DSN,
    DB_NAME,
    PG_HOST,
    PG_PORT,
    PG_USER,
    PGBENCH_SECONDS,
    RUNS,
    SKUS,
    WARMUP,
    N,
    bench_sql,
    log,
    vacuum,
)
from bench.timing import (
    PREPARED,
    SKU_OF,
    Series,
    django_backend_pid,
    django_options,
    measure,
    payload,
    trace_lines,
)
from django_inbox.db.identity import digest_sql

#: The inbox's ON CONFLICT target on PostgreSQL: the digest its unique index holds.
IDENTITY = digest_sql("consumer", "message_id")

# ----------------------------------------------------------------------------- 1. deliver


class RawPsycopg:
    """The same statements without Django: one connection, autocommit off, commit each."""

    UPDATE = "UPDATE shop_stock SET qty = qty - 1 WHERE sku = %s"
    INSERT = (
        "INSERT INTO django_inbox_inboxmessage (consumer, message_id, source, event_type, key, "
        "payload, headers, status, attempts, last_error, history, received_at, updated_at, "
        "next_attempt_at, locked_until, lease_id, processed_at) VALUES (%s, %s, '', %s, '', "
        "%s::jsonb, '{}'::jsonb, 'completed', 1, '', '[]'::jsonb, %s, %s, NULL, NULL, '', %s) "
        f"ON CONFLICT (({IDENTITY})) DO NOTHING RETURNING id"
    )

    def __init__(self) -> None:
        self.conn = psycopg.connect(BENCH_DSN, autocommit=False)
        self.cur = self.conn.cursor()
        self.pid = self.conn.info.backend_pid

    def update_op(self, i: int) -> None:
        self.cur.execute(self.UPDATE, (SKU_OF[i & 0xFFFF],))
        self.conn.commit()

    def inbox_op(self, run: int) -> Callable[[int], None]:
        def op(i: int) -> None:
            now = dt.datetime.now(dt.UTC)
            self.cur.execute(
                self.INSERT,
                ("bench-raw", f"r{run}-{i}", "bench.take", json.dumps(payload(i)), now, now, now),
            )
            if self.cur.fetchone() is None:
                raise RuntimeError("raw insert found a duplicate")
            self.cur.execute(self.UPDATE, (SKU_OF[i & 0xFFFF],))
            self.conn.commit()

        return op

    def close(self) -> None:
        self.conn.close()


def deliver_op(
    prefix: str, expect: str = "processed", *, noop: bool = False
) -> Callable[[int], None]:
    """``deliver()`` of message ``{prefix}-{i}``; check that the outcome is ``expect``.

    ``noop`` delivers to the consumer whose handler does nothing."""
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE, NOOP_CONSUMER, NOOP_EVENT_TYPE
    from django_inbox import deliver

    consumer, event_type = (NOOP_CONSUMER, NOOP_EVENT_TYPE) if noop else (CONSUMER, EVENT_TYPE)

    def op(i: int) -> None:
        outcome = deliver(
            consumer=consumer, message_id=f"{prefix}-{i}", event_type=event_type, payload=payload(i)
        )
        if outcome.value != expect:
            raise RuntimeError(f"deliver() returned {outcome!r}, expected {expect}")

    return op


def bare_op(i: int) -> None:
    """The benchmark handler in a bare ``transaction.atomic()``: no inbox at all."""
    from django.db import transaction

    from bench.inbox_handlers import take_one

    with transaction.atomic():
        take_one(SimpleNamespace(payload=payload(i)))


def bench_deliver() -> dict[str, Series]:
    log(f"\n== 1. deliver() vs baselines: {RUNS} runs x {N} messages each (warm-up {WARMUP})")
    series = {
        "deliver": Series("deliver(), one process"),
        "bare_django": Series("baseline (a): same handler in bare transaction.atomic()"),
        "raw_psycopg": Series("baseline (b): raw psycopg UPDATE, commit each"),
        "raw_psycopg_inbox": Series("raw psycopg running deliver()'s SQL (info)"),
        "deliver_prepared": Series("deliver(), Django OPTIONS with prepared statements (info)"),
        "bare_prepared": Series("bare atomic(), Django OPTIONS with prepared statements (info)"),
        "deliver_noop": Series("deliver() to an empty handler: the inbox alone (info)"),
    }
    raw = RawPsycopg()
    try:
        for run in range(RUNS):
            ops: dict[str, tuple[Callable[[int], object], int | None, dict[str, Any] | None]] = {
                "deliver": (deliver_op(f"d{run}"), None, None),
                "bare_django": (bare_op, None, None),
                "raw_psycopg": (raw.update_op, raw.pid, None),
                "raw_psycopg_inbox": (raw.inbox_op(run), raw.pid, None),
                "deliver_prepared": (deliver_op(f"dp{run}"), None, PREPARED),
                "bare_prepared": (bare_op, None, PREPARED),
                "deliver_noop": (deliver_op(f"dn{run}", noop=True), None, None),
            }
            # Interleaved: each run measures every variant back to back, so a burst of load
            # from elsewhere on the machine hits all of them rather than one.
            for key, (op, backend, options) in ops.items():
                vacuum()
                with django_options(options):
                    rate = measure(series[key], op, backend or django_backend_pid())
                log(f"   run {run + 1}: {series[key].name:58s} {rate:8.0f} msg/s")
    finally:
        raw.close()
    return series


# ----------------------------------------------------------------------------- pgbench

PGBENCH_UPDATE = """\\set n random(0, 9999)
UPDATE shop_stock SET qty = qty - 1 WHERE sku = 'BENCH-' || :n;
"""

PGBENCH_INBOX = """\\set n random(0, 9999)
BEGIN;
INSERT INTO django_inbox_inboxmessage (consumer, message_id, source, event_type, key, payload,
  headers, status, attempts, last_error, history, received_at, updated_at, next_attempt_at,
  locked_until, lease_id, processed_at)
  VALUES ('bench-pgbench', gen_random_uuid()::text, '', 'bench.take', '',
  '{"sku": "BENCH-0"}'::jsonb, '{}'::jsonb, 'completed', 1, '', '[]'::jsonb, now(), now(),
  NULL, NULL, '', now())
  ON CONFLICT ((IDENTITY)) DO NOTHING RETURNING id;
UPDATE shop_stock SET qty = qty - 1 WHERE sku = 'BENCH-' || :n;
END;
""".replace("IDENTITY", IDENTITY)


def pgbench(args: list[str], seconds: int) -> float:
    cmd = ["pgbench", "-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER, "-c", "1", "-j", "1"]
    cmd += ["-T", str(seconds), *args, DB_NAME]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    if re.search(r"number of failed transactions: [1-9]", out):
        raise subprocess.CalledProcessError(1, cmd, out, "failed transactions")
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if not found:
        raise RuntimeError(f"unexpected pgbench output:\n{out}")
    return float(found.group(1))


MARKER = "bench-pgbench-marker"


def captured_deliver_script() -> str | None:
    """deliver()'s statements exactly as Django sends them (libpq trace of one call), as a
    pgbench script: a new message id per transaction, the stock row chosen at random."""
    from django.db import connection

    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import deliver

    connection.ensure_connection()
    lines = trace_lines(
        lambda: deliver(
            consumer=CONSUMER, message_id=MARKER, event_type=EVENT_TYPE, payload={"sku": "BENCH-0"}
        ),
        connection.connection.pgconn,
    )
    sent = [line.split("\t") for line in lines if line.startswith("F\t")]
    if any(fields[2] != "Query" for fields in sent):
        return None  # extended protocol: not text pgbench can replay
    script = [f"\\set n random(0, {SKUS - 1})", "\\set id random(1, 1000000000000000)"]
    for fields in sent:
        sql = fields[3].strip()[1:-1]
        sql = sql.replace(f"'{MARKER}'", ":id::text")  # a constant per transaction
        if "shop_stock" in sql:
            sql = sql.replace("'BENCH-0'", "'BENCH-' || :n")
        script.append(sql + ";")
    return "\n".join(script) + "\n"


def bench_pgbench() -> dict[str, Series]:
    if shutil.which("pgbench") is None:
        log("\n== pgbench not found: the pgbench ceiling is skipped")
        return {}
    short = max(1, PGBENCH_SECONDS // 2)
    log(f"\n== baseline (c): pgbench, 1 client, -M prepared ({PGBENCH_SECONDS}s per run)")
    captured = captured_deliver_script()
    series = {
        "pgbench_update": Series("baseline (c): pgbench, same UPDATE, 1 per transaction", "tps"),
        "pgbench_inbox": Series("pgbench: deliver()'s SQL, prepared (info)", "tps"),
        "pgbench_inbox_simple": Series(
            "pgbench: deliver()'s SQL, simple protocol as Django sends it (info)", "tps"
        ),
        "pgbench_N": Series(f"pgbench built-in -N, scale 1, {short}s (info)", "tps"),
        "pgbench_S": Series(f"pgbench built-in -S, scale 1, {short}s (info)", "tps"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        update_sql = Path(tmp, "update.sql")
        update_sql.write_text(PGBENCH_UPDATE)
        inbox_sql = Path(tmp, "inbox.sql")
        inbox_sql.write_text(captured or PGBENCH_INBOX)
        runs = [
            ("pgbench_update", update_sql, RUNS, "prepared"),
            ("pgbench_inbox", inbox_sql, 1, "prepared"),
            ("pgbench_inbox_simple", inbox_sql, 1, "simple"),
        ]
        for key, script, count, mode in runs:
            for _ in range(count):
                vacuum()
                try:
                    tps = pgbench(["-n", "-M", mode, "-f", str(script)], PGBENCH_SECONDS)
                except subprocess.CalledProcessError as exc:
                    log(f"   {series[key].name}: pgbench failed ({exc.stderr.strip()[:200]})")
                    break
                rate = series[key].add(1, 1 / tps, None, None)
                log(f"   {series[key].name:66s} {rate:8.0f} tps")
        series["pgbench_inbox"].extra["script"] = inbox_sql.read_text()
        init = ["pgbench", "-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER, "-i", "-q"]
        subprocess.run([*init, "-s", "1", DB_NAME], capture_output=True, check=True)
        for key, flag in (("pgbench_N", "-N"), ("pgbench_S", "-S")):
            rate = series[key].add(
                1, 1 / pgbench(["-n", "-M", "prepared", flag], short), None, None
            )
            log(f"   {series[key].name:62s} {rate:8.0f} tps")
    bench_sql("DROP TABLE pgbench_accounts, pgbench_branches, pgbench_history, pgbench_tellers")
    bench_sql("DELETE FROM django_inbox_inboxmessage WHERE consumer = 'bench-pgbench'")
    return series
