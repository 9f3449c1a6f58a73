#!/usr/bin/env python
"""Benchmark suite of django-transactional-inbox. Run it with ``./scripts/bench``.

Measures, in one run on this machine, against a database of its own (``inbox_bench``,
dropped and created here, dropped again at the end unless ``BENCH_KEEP_DB=1``):

1. ``deliver()`` throughput in one process, beside three baselines running the same
   single-row UPDATE: the handler in a bare ``transaction.atomic()``, raw psycopg, pgbench.
2. ``inbox_process`` drain throughput: ``store()`` N messages, drain them with the real
   worker in process and as a ``manage.py inbox_process`` subprocess.
3. Duplicate rejection: ``deliver()`` of already-completed ids.
4. ``store()`` of new messages, one per transaction (and batched, and duplicates).

Then it counts round trips per operation (libpq trace) and profiles one run of ``deliver()``
and of the drain with cProfile, and writes ``bench/results/latest.json`` and ``latest.md``.

Knobs (environment): ``BENCH_N`` messages per timed run (5000), ``BENCH_RUNS`` runs per
figure (3, the median is reported), ``BENCH_DRAIN_N`` messages drained (100000),
``BENCH_DRAIN_RUNS`` in-process drain runs (3), ``BENCH_PGBENCH_SECONDS`` (10),
``BENCH_KEEP_DB`` (0).
"""

from __future__ import annotations

import cProfile
import datetime as dt
import json
import os
import platform
import pstats
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
MANAGE = ROOT / "testproject" / "manage.py"
if sys.path and Path(sys.path[0] or ".").resolve() == BENCH_DIR:
    sys.path.pop(0)  # import bench.* as a package, never its modules as top-level ones
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]

DB_NAME = "inbox_bench"
PG_HOST = "127.0.0.1"
PG_PORT = 5432
PG_USER = "postgres"
DATABASE_URL = f"postgres://{PG_USER}@{PG_HOST}:{PG_PORT}/{DB_NAME}"
ADMIN_DSN = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"
BENCH_DSN = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{DB_NAME}"


def _env_int(name: str, default: int) -> int:
    value = int(os.environ.get(name, default))
    if value < 1:
        raise SystemExit(f"{name} must be at least 1")
    return value


N = _env_int("BENCH_N", 5000)
RUNS = _env_int("BENCH_RUNS", 3)
DRAIN_N = _env_int("BENCH_DRAIN_N", 100_000)
DRAIN_RUNS = _env_int("BENCH_DRAIN_RUNS", 3)
PGBENCH_SECONDS = _env_int("BENCH_PGBENCH_SECONDS", 10)
KEEP_DB = os.environ.get("BENCH_KEEP_DB", "0") not in ("", "0", "false", "no")
WARMUP = max(200, N // 10)
PROFILE_N = 3000

# Targets of the product (see the brief in bench/README.md).
TARGET_DELIVER_RATIO = 0.85
TARGET_DRAIN = 5000.0
TARGET_DUPLICATES = 10_000.0

os.environ["DATABASE_URL"] = DATABASE_URL
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
os.environ.setdefault("INBOX_LOG_LEVEL", "ERROR")

import psycopg  # noqa: E402


def log(text: str) -> None:
    print(text, flush=True)


# ----------------------------------------------------------------------------- database


def admin(sql: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        conn.execute(sql)


def recreate_database() -> None:
    admin(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    admin(f"CREATE DATABASE {DB_NAME}")


def drop_database() -> None:
    from django.db import connections

    connections.close_all()
    admin(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")


def setup_django() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0, interactive=False)


def bench_sql(sql: str) -> list[tuple[Any, ...]]:
    """Run maintenance SQL (VACUUM, TRUNCATE, SHOW) on the bench database, autocommit."""
    with psycopg.connect(BENCH_DSN, autocommit=True) as conn:
        cur = conn.execute(sql)
        return cur.fetchall() if cur.description else []


def vacuum() -> None:
    # autovacuum may be off on the server (it is here): vacuum between timed runs so every
    # run starts from the same state instead of paying for the previous run's dead rows.
    bench_sql("VACUUM (ANALYZE) shop_stock, django_inbox_inboxmessage")


def truncate_inbox() -> None:
    bench_sql("TRUNCATE django_inbox_inboxmessage")
    vacuum()


def seed_stock() -> None:
    from shop.models import Stock

    from bench.inbox_handlers import SKUS

    Stock.objects.bulk_create([Stock(sku=f"BENCH-{i}", qty=10**9) for i in range(SKUS)])


def machine_facts() -> dict[str, Any]:
    import django

    settings = dict(
        bench_sql(
            "SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', "
            "'commit_delay', 'shared_buffers', 'autovacuum', 'wal_level', 'max_wal_size')"
        )
    )
    version = bench_sql("SELECT version()")[0][0]
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "load_average_at_start": [float(x) for x in load],
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.__version__,
        "psycopg": psycopg.__version__,
        "psycopg_impl": psycopg.pq.__impl__,
        "postgresql": version,
        "postgresql_settings": settings,
        "database_url": DATABASE_URL,
        "django_settings": "bench.settings (testproject.settings + app 'bench', DEBUG=False)",
    }


# ----------------------------------------------------------------------------- timing


def payload(i: int) -> dict[str, str]:
    return {"sku": f"BENCH-{i % 100}"}


class Series:
    """Repeated timed runs of one figure; the median rate is the figure."""

    def __init__(self, name: str, unit: str = "msg/s") -> None:
        self.name = name
        self.unit = unit
        self.rates: list[float] = []
        self.extra: dict[str, Any] = {}

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "median": round(self.median, 1),
            "runs": [round(r, 1) for r in self.rates],
            **self.extra,
        }


def timed(op: Callable[[int], object], count: int, start: int = 0) -> float:
    """Run ``op(i)`` for ``count`` consecutive ``i``; return operations per second."""
    began = time.perf_counter()
    for i in range(start, start + count):
        op(i)
    return count / (time.perf_counter() - began)


# ----------------------------------------------------------------------------- 1. deliver


def deliver_ops(run: int) -> dict[str, Callable[[int], object]]:
    """The four per-message operations compared in section 1, fresh ids for ``run``."""
    from django.db import transaction

    from bench.inbox_handlers import CONSUMER, EVENT_TYPE, take_one
    from django_inbox import Outcome, deliver

    def inbox(i: int) -> None:
        outcome = deliver(
            consumer=CONSUMER, message_id=f"d{run}-{i}", event_type=EVENT_TYPE, payload=payload(i)
        )
        if outcome is not Outcome.PROCESSED:
            raise RuntimeError(f"deliver() returned {outcome!r}")

    def bare(i: int) -> None:
        with transaction.atomic():
            take_one(SimpleNamespace(payload=payload(i)))

    return {"deliver": inbox, "bare_django": bare}


class RawPsycopg:
    """The same statements without Django: one connection, autocommit off, commit each."""

    UPDATE = "UPDATE shop_stock SET qty = qty - 1 WHERE sku = %s"
    INSERT = (
        "INSERT INTO django_inbox_inboxmessage (consumer, message_id, source, event_type, key, "
        "payload, headers, status, attempts, last_error, history, received_at, updated_at, "
        "next_attempt_at, locked_until, lease_id, processed_at) VALUES (%s, %s, '', %s, '', "
        "%s::jsonb, '{}'::jsonb, 'completed', 1, '', '[]'::jsonb, %s, %s, NULL, NULL, '', %s) "
        "ON CONFLICT (consumer, message_id) DO NOTHING RETURNING id"
    )

    def __init__(self) -> None:
        self.conn = psycopg.connect(BENCH_DSN, autocommit=False)
        self.cur = self.conn.cursor()

    def update_op(self, i: int) -> None:
        self.cur.execute(self.UPDATE, (f"BENCH-{i % 100}",))
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
            self.cur.execute(self.UPDATE, (f"BENCH-{i % 100}",))
            self.conn.commit()

        return op

    def close(self) -> None:
        self.conn.close()


def bench_deliver() -> dict[str, Series]:
    log(f"\n== 1. deliver() vs baselines: {RUNS} runs x {N} messages (warm-up {WARMUP})")
    series = {
        "deliver": Series("deliver(), one process"),
        "bare_django": Series("baseline: handler in bare transaction.atomic()"),
        "raw_psycopg": Series("baseline: raw psycopg UPDATE + COMMIT"),
        "raw_psycopg_inbox": Series("raw psycopg, deliver()'s SQL (INSERT + UPDATE + COMMIT)"),
    }
    raw = RawPsycopg()
    try:
        for run in range(RUNS):
            ops = deliver_ops(run)
            ops["raw_psycopg"] = raw.update_op
            ops["raw_psycopg_inbox"] = raw.inbox_op(run)
            # Interleaved: each run measures all four back to back, so a burst of load from
            # elsewhere on the machine hits all of them rather than one.
            for key, op in ops.items():
                vacuum()
                timed(op, WARMUP, start=10**8)
                rate = timed(op, N)
                series[key].rates.append(rate)
                log(f"   run {run + 1}: {series[key].name:58s} {rate:9.0f} msg/s")
    finally:
        raw.close()
    return series


# ----------------------------------------------------------------------------- pgbench

PGBENCH_UPDATE = """\\set n random(0, 99)
UPDATE shop_stock SET qty = qty - 1 WHERE sku = 'BENCH-' || :n;
"""

PGBENCH_INBOX = """\\set n random(0, 99)
BEGIN;
INSERT INTO django_inbox_inboxmessage (consumer, message_id, source, event_type, key, payload,
  headers, status, attempts, last_error, history, received_at, updated_at, next_attempt_at,
  locked_until, lease_id, processed_at)
  VALUES ('bench-pgbench', gen_random_uuid()::text, '', 'bench.take', '',
  '{"sku": "BENCH-0"}'::jsonb, '{}'::jsonb, 'completed', 1, '', '[]'::jsonb, now(), now(),
  NULL, NULL, '', now())
  ON CONFLICT (consumer, message_id) DO NOTHING RETURNING id;
UPDATE shop_stock SET qty = qty - 1 WHERE sku = 'BENCH-' || :n;
END;
"""


def pgbench(args: list[str], seconds: int) -> float:
    cmd = [
        "pgbench",
        "-h",
        PG_HOST,
        "-p",
        str(PG_PORT),
        "-U",
        PG_USER,
        "-c",
        "1",
        "-j",
        "1",
        "-T",
        str(seconds),
        *args,
        DB_NAME,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if not found:
        raise RuntimeError(f"unexpected pgbench output:\n{out}")
    return float(found.group(1))


def bench_pgbench() -> dict[str, Series]:
    if shutil.which("pgbench") is None:
        log("\n== pgbench not found: skipping the pgbench ceiling")
        return {}
    log(f"\n== pgbench ceiling, 1 client, {PGBENCH_SECONDS}s per run")
    series = {
        "pgbench_update": Series("pgbench: same UPDATE, 1 tx each (-M prepared)", "tps"),
        "pgbench_inbox": Series("pgbench: deliver()'s SQL (BEGIN, INSERT, UPDATE, END)", "tps"),
        "pgbench_N": Series("pgbench built-in -N (simple update), scale 1", "tps"),
        "pgbench_S": Series("pgbench built-in -S (select only), scale 1", "tps"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        update_sql = Path(tmp, "update.sql")
        update_sql.write_text(PGBENCH_UPDATE)
        inbox_sql = Path(tmp, "inbox.sql")
        inbox_sql.write_text(PGBENCH_INBOX)
        runs = {
            "pgbench_update": (["-n", "-M", "prepared", "-f", str(update_sql)], RUNS),
            "pgbench_inbox": (["-n", "-M", "prepared", "-f", str(inbox_sql)], 1),
        }
        for key, (args, count) in runs.items():
            for _ in range(count):
                vacuum()
                rate = pgbench(args, PGBENCH_SECONDS)
                series[key].rates.append(rate)
                log(f"   {series[key].name:60s} {rate:9.0f} tps")
        subprocess.run(
            ["pgbench", "-h", PG_HOST, "-p", str(PG_PORT), "-U", PG_USER, "-i", "-q", "-s", "1"]
            + [DB_NAME],
            capture_output=True,
            check=True,
        )
        for key, flag in (("pgbench_N", "-N"), ("pgbench_S", "-S")):
            rate = pgbench(["-n", "-M", "prepared", flag], PGBENCH_SECONDS)
            series[key].rates.append(rate)
            log(f"   {series[key].name:60s} {rate:9.0f} tps")
    bench_sql("DROP TABLE IF EXISTS pgbench_accounts, pgbench_branches, pgbench_history, "
              "pgbench_tellers")
    bench_sql("DELETE FROM django_inbox_inboxmessage WHERE consumer = 'bench-pgbench'")
    return series


# ----------------------------------------------------------------------------- 3. duplicates


def bench_duplicates() -> dict[str, Series]:
    """Re-deliver ids the deliver benchmark completed (there are RUNS * N of them)."""
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import Outcome, deliver, store

    log(f"\n== 3. duplicate rejection: {RUNS} runs x {N} already-completed ids")
    series = {
        "duplicate_deliver": Series("deliver() of an already-completed id"),
        "duplicate_store": Series("store() of an already-stored id (info)"),
    }

    def dup_deliver(run: int) -> Callable[[int], None]:
        def op(i: int) -> None:
            outcome = deliver(
                consumer=CONSUMER,
                message_id=f"d{run}-{i % N}",
                event_type=EVENT_TYPE,
                payload=payload(i),
            )
            if outcome is not Outcome.DUPLICATE:
                raise RuntimeError(f"duplicate deliver() returned {outcome!r}")

        return op

    def dup_store(run: int) -> Callable[[int], None]:
        def op(i: int) -> None:
            if store(
                consumer=CONSUMER,
                message_id=f"d{run}-{i % N}",
                event_type=EVENT_TYPE,
                payload=payload(i),
            ):
                raise RuntimeError("duplicate store() stored a row")

        return op

    vacuum()
    for run in range(RUNS):
        for key, make in (("duplicate_deliver", dup_deliver), ("duplicate_store", dup_store)):
            op = make(run)
            timed(op, WARMUP)
            rate = timed(op, N)
            series[key].rates.append(rate)
            log(f"   run {run + 1}: {series[key].name:58s} {rate:9.0f} msg/s")
    return series


# ----------------------------------------------------------------------------- 4. store


def store_op(prefix: str) -> Callable[[int], None]:
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import store

    def op(i: int) -> None:
        if not store(
            consumer=CONSUMER, message_id=f"{prefix}-{i}", event_type=EVENT_TYPE, payload=payload(i)
        ):
            raise RuntimeError("store() found a duplicate of a new id")

    return op


def bench_store() -> dict[str, Series]:
    log(f"\n== 4. store(), new messages, one transaction each: {RUNS} runs x {N}")
    series = Series("store(), one transaction per message (autocommit)")
    for run in range(RUNS):
        truncate_inbox()
        op = store_op(f"s{run}")
        timed(op, WARMUP, start=10**8)
        rate = timed(op, N)
        series.rates.append(rate)
        log(f"   run {run + 1}: {series.name:58s} {rate:9.0f} msg/s")
    truncate_inbox()
    return {"store_single": series}


# ----------------------------------------------------------------------------- 2. drain


def store_batch(prefix: str, count: int) -> float:
    """``store()`` ``count`` new messages inside one transaction; return messages/s."""
    from django.db import transaction

    op = store_op(prefix)
    began = time.perf_counter()
    with transaction.atomic():
        for i in range(count):
            op(i)
    return count / (time.perf_counter() - began)


def pending_count() -> int:
    return int(
        bench_sql(
            "SELECT count(*) FROM django_inbox_inboxmessage WHERE status <> 'completed' "
            "AND consumer = 'bench'"
        )[0][0]
    )


def drain_in_process(
    label: str, count: int, *, persistent: bool = False
) -> tuple[float, float, dict[str, Any]]:
    """Store ``count`` messages, drain them with ``Worker.run()``; (store rate, drain rate, info)."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    from bench.inbox_handlers import CONSUMER
    from django_inbox.worker import Worker

    truncate_inbox()
    store_rate = store_batch(label, count)
    vacuum()  # what autovacuum's ANALYZE would have done after a 100k-row insert
    batches: list[tuple[float, int]] = []

    class TimedWorker(Worker):
        """The real worker; only notes when each batch ended (one clock read per batch)."""

        def run_once(self) -> int:
            handled = super().run_once()
            batches.append((time.perf_counter(), handled))
            return handled

    connects = Counter[str]()

    def on_connect(**_: Any) -> None:
        connects["n"] += 1

    conn = connections["default"]
    saved_age = conn.settings_dict.get("CONN_MAX_AGE", 0)
    if persistent:
        conn.settings_dict["CONN_MAX_AGE"] = None
        conn.close()
    connection_created.connect(on_connect)
    try:
        worker = TimedWorker(consumers=[CONSUMER], until_idle=0)
        began = time.perf_counter()
        stats = worker.run()
        elapsed = time.perf_counter() - began
    finally:
        connection_created.disconnect(on_connect)
        conn.settings_dict["CONN_MAX_AGE"] = saved_age
        conn.close()
    if stats.outcomes.get("processed") != count or pending_count():
        raise RuntimeError(f"drain did not process every message: {dict(stats.outcomes)}")
    # Throughput over the first and the last tenth of the messages: does it degrade?
    tenth = max(1, count // 10)
    done, marks = 0, [(began, 0)]
    for at, handled in batches:
        done += handled
        marks.append((at, done))

    def rate_between(lo: int, hi: int) -> float:
        t0 = next(at for at, d in marks if d >= lo)
        t1 = next(at for at, d in marks if d >= hi)
        return (hi - lo) / (t1 - t0) if t1 > t0 else 0.0

    info = {
        "seconds": round(elapsed, 2),
        "batches": len(batches),
        "connections_opened": connects["n"],
        "first_tenth_msg_s": round(rate_between(0, tenth), 1),
        "last_tenth_msg_s": round(rate_between(count - tenth, count), 1),
    }
    return store_rate, count / elapsed, info


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = DATABASE_URL
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "testproject")])
    return env


def run_inbox_process() -> float:
    from bench.inbox_handlers import CONSUMER

    cmd = [
        sys.executable,
        str(MANAGE),
        "inbox_process",
        "--consumer",
        CONSUMER,
        "--until-idle",
        "0",
        "--verbosity",
        "0",
    ]
    began = time.perf_counter()
    subprocess.run(cmd, env=subprocess_env(), check=True)
    return time.perf_counter() - began


def bench_drain() -> dict[str, Series]:
    log(
        f"\n== 2. drain: store() {DRAIN_N} messages in one transaction, then drain them "
        f"({DRAIN_RUNS} in-process runs, 1 subprocess run, 1 with a persistent connection)"
    )
    series = {
        "drain_in_process": Series("drain: Worker.run() in process"),
        "drain_subprocess": Series("drain: manage.py inbox_process subprocess (wall clock)"),
        "drain_subprocess_net": Series("drain: inbox_process subprocess, start-up excluded"),
        "drain_persistent": Series("drain in process, CONN_MAX_AGE=None (no reconnects)"),
        "store_batched": Series("store() in one transaction (drain preparation)"),
    }
    runs_info = []
    for run in range(DRAIN_RUNS):
        store_rate, rate, info = drain_in_process(f"q{run}", DRAIN_N)
        series["store_batched"].rates.append(store_rate)
        series["drain_in_process"].rates.append(rate)
        runs_info.append(info)
        log(f"   run {run + 1}: stored at {store_rate:7.0f} msg/s; drained at {rate:7.0f} msg/s "
            f"{info}")
    series["drain_in_process"].extra["runs_detail"] = runs_info

    store_rate, rate, info = drain_in_process("qp", DRAIN_N, persistent=True)
    series["store_batched"].rates.append(store_rate)
    series["drain_persistent"].rates.append(rate)
    series["drain_persistent"].extra["runs_detail"] = [info]
    log(f"   persistent connection: drained at {rate:7.0f} msg/s {info}")

    # The subprocess: its start-up (Django set-up, autodiscovery, first connect) is measured
    # on an empty inbox and reported apart.
    truncate_inbox()
    startup = statistics.median(run_inbox_process() for _ in range(3))
    store_rate = store_batch("qs", DRAIN_N)
    series["store_batched"].rates.append(store_rate)
    vacuum()
    wall = run_inbox_process()
    if pending_count():
        raise RuntimeError("inbox_process left messages behind")
    series["drain_subprocess"].rates.append(DRAIN_N / wall)
    series["drain_subprocess_net"].rates.append(DRAIN_N / max(wall - startup, 1e-9))
    series["drain_subprocess"].extra.update(
        seconds=round(wall, 2), startup_seconds=round(startup, 3)
    )
    log(
        f"   subprocess: {DRAIN_N} in {wall:.1f}s = {DRAIN_N / wall:.0f} msg/s wall clock "
        f"(start-up {startup:.2f}s; {DRAIN_N / (wall - startup):.0f} msg/s without it)"
    )
    truncate_inbox()
    return series


# ----------------------------------------------------------------------------- round trips


def trace(fn: Callable[[], object], pgconn: Any) -> dict[str, Any]:
    """Run ``fn`` with libpq tracing on ``pgconn``; count round trips and statements."""
    with tempfile.NamedTemporaryFile("w+", suffix=".trace") as fh:
        pgconn.trace(fh.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            fn()
        finally:
            pgconn.untrace()
        fh.flush()
        fh.seek(0)
        lines = fh.read().splitlines()
    round_trips = sum(1 for line in lines if "\tReadyForQuery\t" in line and line[0] == "B")
    statements = []
    for line in lines:
        if line.startswith("F") and ("\tQuery\t" in line or "\tParse\t" in line):
            text = line.split("\t", 3)[3].strip()
            if "\tParse\t" in line:
                text = text.split('"', 4)[3] if text.count('"') >= 4 else text
            statements.append(_shorten(text))
    return {"round_trips": round_trips, "statements": statements}


def _shorten(sql: str) -> str:
    sql = sql.strip().strip('"')
    sql = re.sub(r"\s+", " ", sql)
    first = sql.split(" ")[0].upper()
    if first in ("BEGIN", "COMMIT", "END", "ROLLBACK"):
        return first
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', sql)
    where = table.group(1) if table else ""
    extra = ""
    if "ON CONFLICT" in sql:
        extra = " ON CONFLICT DO NOTHING RETURNING"
    elif "FOR UPDATE SKIP LOCKED" in sql:
        extra = " … FOR UPDATE SKIP LOCKED"
    return f"{first} {where}{extra}".strip()


def round_trips() -> dict[str, Any]:
    """Round trips per operation, counted from the wire (libpq trace) over 20 messages."""
    from django.db import connection, transaction

    from bench.inbox_handlers import CONSUMER, EVENT_TYPE, take_one
    from django_inbox import deliver
    from django_inbox.worker import Worker

    log("\n== round trips per message (libpq trace)")
    truncate_inbox()
    connection.ensure_connection()
    pg = connection.connection.pgconn
    k = 20
    store_op("warm")(0)
    out: dict[str, Any] = {}

    def per(fn: Callable[[int], object]) -> Callable[[], None]:
        return lambda: [fn(i) for i in range(k)]

    def dlv(i: int) -> object:
        return deliver(
            consumer=CONSUMER, message_id=f"t-{i}", event_type=EVENT_TYPE, payload=payload(i)
        )

    def bare(i: int) -> None:
        with transaction.atomic():
            take_one(SimpleNamespace(payload=payload(i)))

    for name, fn in (
        ("deliver", dlv),
        ("duplicate_deliver", dlv),
        ("bare_django", bare),
        ("store_single", store_op("tr")),
    ):
        found = trace(per(fn), pg)
        out[name] = {
            "round_trips_per_message": found["round_trips"] / k,
            "statements_one_message": found["statements"][: len(found["statements"]) // k],
        }
    raw = RawPsycopg()
    found = trace(per(raw.update_op), raw.conn.pgconn)
    out["raw_psycopg"] = {
        "round_trips_per_message": found["round_trips"] / k,
        "statements_one_message": found["statements"][: len(found["statements"]) // k],
    }
    raw.close()

    # The drain: one run_once() claims and processes a batch of 100.
    truncate_inbox()
    store_batch("tw", 100)
    worker = Worker(consumers=[CONSUMER], until_idle=0)
    connection.ensure_connection()
    found = trace(worker.run_once, connection.connection.pgconn)
    per_batch = found["statements"]
    claim = per_batch[:5]
    out["drain"] = {
        "round_trips_per_message": found["round_trips"] / 100,
        "batch_size": 100,
        "round_trips_per_batch": found["round_trips"],
        "claim_statements_per_batch": claim,
        "statements_one_message": per_batch[5:9],
        "note": "plus one reconnect per batch with CONN_MAX_AGE=0 (close_old_connections)",
    }
    for name, found in out.items():
        log(f"   {name:18s} {found['round_trips_per_message']:5.2f} round trips/message: "
            f"{', '.join(found['statements_one_message'])}")
    truncate_inbox()
    return out


# ----------------------------------------------------------------------------- profiles


def profile(fn: Callable[[], object], count: int) -> dict[str, Any]:
    profiler = cProfile.Profile()
    began = time.perf_counter()
    profiler.runcall(fn)
    elapsed = time.perf_counter() - began
    stats = pstats.Stats(profiler)
    groups: Counter[str] = Counter()
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        groups[_group(filename, func)] += tottime
        rows.append((tottime, ncalls, _where(filename, line, func)))
    total = sum(groups.values())
    rows.sort(reverse=True)
    return {
        "messages": count,
        "seconds_under_profiler": round(elapsed, 3),
        "us_per_message_under_profiler": round(elapsed / count * 1e6, 1),
        "share_by_group": {g: round(t / total, 3) for g, t in groups.most_common()},
        "us_per_message_by_group": {
            g: round(t / count * 1e6, 1) for g, t in groups.most_common()
        },
        "top_functions": [
            {"where": where, "calls_per_message": round(nc / count, 2),
             "share": round(tt / total, 3)}
            for tt, nc, where in rows[:15]
        ],
    }


def _where(filename: str, line: int, func: str) -> str:
    if filename == "~":
        return func
    for marker in ("site-packages/", "/work/main/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
    return f"{filename}:{line}({func})"


def _group(filename: str, func: str) -> str:
    """Where time goes, in a few buckets a reader can act on."""
    if filename == "~":
        if "psycopg" in func and ("wait" in func or "execute" in func or "fetch" in func):
            return "server round trips (psycopg waiting on the socket)"
        if "psycopg" in func or "pq" in func:
            return "psycopg client (encode/decode)"
        if "json" in func:
            return "json"
        return "builtins"
    if "psycopg" in filename:
        return "psycopg client (encode/decode)"
    if "/django/db/models/" in filename:
        return "Django ORM (query build/compile)"
    if "/django/db/" in filename:
        return "Django db layer (cursor, atomic)"
    if "/django/" in filename:
        return "Django other (signals, settings, timezone)"
    if "django_inbox/" in filename:
        return "django_inbox"
    if "/json/" in filename:
        return "json"
    if "/bench/" in filename:
        return "bench harness"
    return "other Python"


def profiles() -> dict[str, Any]:
    from django.db import transaction

    from bench.inbox_handlers import CONSUMER, EVENT_TYPE, take_one
    from django_inbox import deliver
    from django_inbox.worker import Worker

    log(f"\n== cProfile: deliver() x {PROFILE_N}, duplicate deliver() x {PROFILE_N}, "
        f"drain of {PROFILE_N * 3}")
    truncate_inbox()
    out = {}

    def dlv() -> None:
        for i in range(PROFILE_N):
            deliver(consumer=CONSUMER, message_id=f"p-{i}", event_type=EVENT_TYPE,
                    payload=payload(i))

    def bare() -> None:
        for i in range(PROFILE_N):
            with transaction.atomic():
                take_one(SimpleNamespace(payload=payload(i)))

    out["deliver"] = profile(dlv, PROFILE_N)
    out["duplicate_deliver"] = profile(dlv, PROFILE_N)
    out["bare_django"] = profile(bare, PROFILE_N)
    truncate_inbox()
    store_batch("pw", PROFILE_N * 3)
    vacuum()
    out["drain"] = profile(Worker(consumers=[CONSUMER], until_idle=0).run, PROFILE_N * 3)
    truncate_inbox()
    for name, found in out.items():
        groups = ", ".join(
            f"{g} {us:.0f}us" for g, us in list(found["us_per_message_by_group"].items())[:5]
        )
        log(f"   {name:18s} {found['us_per_message_under_profiler']:6.0f} us/msg profiled: {groups}")
    return out


# ----------------------------------------------------------------------------- report


def main() -> int:
    began = time.perf_counter()
    log(f"inbox benchmark: database {DB_NAME} (dropped and created), N={N}, runs={RUNS}, "
        f"drain N={DRAIN_N}")
    recreate_database()
    try:
        setup_django()
        seed_stock()
        facts = machine_facts()
        log(f"   {facts['nproc']} cores, load {facts['load_average_at_start']}, "
            f"{facts['postgresql'].split(' on ')[0]}, {facts['postgresql_settings']}")
        figures: dict[str, Series] = {}
        figures.update(bench_deliver())
        figures.update(bench_duplicates())
        figures.update(bench_pgbench())
        figures.update(bench_store())
        figures.update(bench_drain())
        wire = round_trips()
        prof = profiles()
    finally:
        if not KEEP_DB:
            drop_database()
    with open("/proc/loadavg") as fh:
        facts["load_average_at_end"] = [float(x) for x in fh.read().split()[:3]]
    facts["bench_seconds"] = round(time.perf_counter() - began, 1)
    from bench.report import write_report

    table = write_report(
        RESULTS,
        facts=facts,
        figures={k: v.as_dict() for k, v in figures.items()},
        wire=wire,
        prof=prof,
        config={"N": N, "RUNS": RUNS, "WARMUP": WARMUP, "DRAIN_N": DRAIN_N,
                "DRAIN_RUNS": DRAIN_RUNS, "PGBENCH_SECONDS": PGBENCH_SECONDS},
        targets={"deliver_ratio": TARGET_DELIVER_RATIO, "drain": TARGET_DRAIN,
                 "duplicates": TARGET_DUPLICATES},
    )
    log("\n" + table)
    log(f"\nwrote {RESULTS / 'latest.json'} and {RESULTS / 'latest.md'} "
        f"in {facts['bench_seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
