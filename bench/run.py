#!/usr/bin/env python
"""Benchmark suite of django-transactional-inbox. Run it with ``./scripts/bench``.

Measures, in one run on this machine, against a database of its own (``inbox_bench``,
dropped and created here, dropped again at the end unless ``BENCH_KEEP_DB=1``):

1. ``deliver()`` throughput in one process, beside baselines running the same single-row
   UPDATE: the handler in a bare ``transaction.atomic()``, raw psycopg, pgbench.
2. ``inbox_process`` drain throughput: ``store()`` N messages, drain them with the real
   worker in process and as ``manage.py inbox_process`` subprocesses (one, then two).
3. Duplicate rejection: ``deliver()`` of already-completed ids.
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
cProfile, and writes ``bench/results/latest.json`` and ``latest.md``.

Knobs (environment): ``BENCH_N`` messages per timed run (5000), ``BENCH_RUNS`` runs per
figure (3; the median is reported), ``BENCH_DRAIN_N`` messages per drain (100000),
``BENCH_DRAIN_RUNS`` in-process drain runs (3), ``BENCH_PGBENCH_SECONDS`` (10),
``BENCH_KEEP_DB`` (0: drop ``inbox_bench`` at the end), ``BENCH_CONSUME_N`` messages per
consumer run (20000), ``BENCH_CONSUME_RUNS`` (``BENCH_RUNS``), ``BENCH_RABBITMQ_URL``,
``BENCH_REDIS_URL``.
"""

from __future__ import annotations

import cProfile
import datetime as dt
import inspect
import json
import os
import platform
import pstats
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

from bench.common import code_version  # noqa: E402  (importable once the path is set)

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
CONSUME_N = _env_int("BENCH_CONSUME_N", 20_000)
CONSUME_RUNS = _env_int("BENCH_CONSUME_RUNS", RUNS)
CONSUME_PROFILE_N = min(CONSUME_N, 6000)
BROKERS = {
    "rabbitmq": os.environ.get("BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    "redis": os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5"),
}
WARMUP = max(200, N // 10)
SKUS = 10_000  # stock rows the handler's updates are spread over: BENCH-0 … BENCH-9999
PROFILE_N = min(N, 3000)
CLK_TCK = os.sysconf("SC_CLK_TCK")

TARGETS = {
    "deliver_vs_bare": 0.85,
    "drain": 5000.0,
    "duplicates": 10_000.0,
    "consume_vs_plain": 0.8,
    "consume": 2000.0,
}

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

    Stock.objects.bulk_create([Stock(sku=f"BENCH-{i}", qty=10**9) for i in range(SKUS)])


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine_facts() -> dict[str, Any]:
    import django

    settings = dict(
        bench_sql(
            "SELECT name, setting || COALESCE(unit, '') FROM pg_settings WHERE name IN "
            "('fsync', 'synchronous_commit', 'wal_sync_method', 'full_page_writes', "
            "'commit_delay', 'shared_buffers', 'autovacuum', 'wal_level', 'max_wal_size')"
        )
    )
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "load_average_at_start": loadavg(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.__version__,
        "psycopg": f"{psycopg.__version__} ({psycopg.pq.__impl__})",
        "postgresql": bench_sql("SELECT version()")[0][0].split(" on ")[0],
        "postgresql_settings": settings,
        "database_url": DATABASE_URL,
        "django_settings": "bench.settings = testproject.settings + app 'bench', DEBUG=False",
        "code": code_version(),
    }


# ----------------------------------------------------------------------------- timing


def _sku_table() -> list[str]:
    """Message i updates stock row ``SKU_OF[i % 65536]``: pseudo-random, so two workers
    draining neighbouring batches rarely update the same row at the same time (that would
    measure row-lock waits, not the inbox)."""
    import random

    rng = random.Random(20240601)
    return [f"BENCH-{rng.randrange(SKUS)}" for _ in range(65536)]


SKU_OF = _sku_table()


def payload(i: int) -> dict[str, str]:
    return {"sku": SKU_OF[i & 0xFFFF]}


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` (a PostgreSQL backend)."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> float:
    """CPU seconds all processes on this machine have used so far (from /proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / CLK_TCK


PREPARED = {"server_side_binding": True, "prepare_threshold": 5}


@contextmanager
def django_options(options: dict[str, Any] | None) -> Iterator[None]:
    """Reconnect Django's connection with extra ``OPTIONS`` (e.g. prepared statements)."""
    from django.db import connection

    if not options:
        yield
        return
    saved = dict(connection.settings_dict["OPTIONS"])
    connection.close()
    connection.settings_dict["OPTIONS"] = {**saved, **options}
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["OPTIONS"] = saved


def django_backend_pid() -> int:
    from django.db import connection

    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


class Series:
    """Repeated timed runs of one figure; the median rate is the figure."""

    def __init__(self, name: str, unit: str = "msg/s") -> None:
        self.name = name
        self.unit = unit
        self.rates: list[float] = []
        self.client_us: list[float] = []
        self.server_us: list[float] = []
        self.machine_cores: list[float] = []
        self.other_cores: list[float] = []
        self.extra: dict[str, Any] = {}

    def add(
        self,
        count: int,
        wall: float,
        client: float | None,
        server: float | None,
        busy: float | None = None,
    ) -> float:
        """Record one run: ``count`` messages in ``wall`` s, CPU seconds of client, server
        and of the whole machine (``busy``) during the run."""
        rate = count / wall
        self.rates.append(rate)
        if client is not None:
            self.client_us.append(client / count * 1e6)
        if server is not None:
            self.server_us.append(server / count * 1e6)
        if busy is not None:
            self.machine_cores.append(busy / wall)
            if client is not None and server is not None:
                self.other_cores.append(max(0.0, busy - client - server) / wall)
        return rate

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "unit": self.unit,
            "median": round(self.median, 1),
            "runs": [round(r, 1) for r in self.rates],
        }
        if self.rates and self.unit == "msg/s":
            out["wall_us_per_msg"] = round(1e6 / self.median, 1)
        if self.client_us:
            out["client_cpu_us_per_msg"] = round(statistics.median(self.client_us), 1)
        if self.server_us:
            out["server_cpu_us_per_msg"] = round(statistics.median(self.server_us), 1)
        if self.machine_cores:
            out["machine_busy_cores"] = [round(c, 2) for c in self.machine_cores]
        if self.other_cores:
            out["other_processes_cores"] = [round(c, 2) for c in self.other_cores]
        out.update(self.extra)
        return out


@contextmanager
def measuring(series: Series, count: int, backend_pid: int | None) -> Iterator[None]:
    """Time the block; add wall rate, client CPU and backend CPU per message to ``series``."""
    server0 = proc_cpu(backend_pid)
    busy0 = machine_busy()
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    yield
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    busy = machine_busy() - busy0
    server = proc_cpu(backend_pid) - server0 if backend_pid else None
    series.add(count, wall, cpu, server, busy)


def run_ops(op: Callable[[int], object], count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        op(i)


def measure(series: Series, op: Callable[[int], object], backend_pid: int | None) -> float:
    """Warm up, then run ``op`` over ``N`` messages; return the rate of this run."""
    run_ops(op, WARMUP, start=10**8)
    with measuring(series, N, backend_pid):
        run_ops(op, N)
    return series.rates[-1]


# ----------------------------------------------------------------------------- 1. deliver


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
  ON CONFLICT (consumer, message_id) DO NOTHING RETURNING id;
UPDATE shop_stock SET qty = qty - 1 WHERE sku = 'BENCH-' || :n;
END;
"""


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


# ----------------------------------------------------------------------------- 3. duplicates


def bench_duplicates() -> dict[str, Series]:
    """Re-deliver ids that section 1 completed (``d{run}-0`` … ``d{run}-{N-1}``)."""
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
    pid = django_backend_pid()
    for run in range(RUNS):
        for key, make in (("duplicate_deliver", dup_deliver), ("duplicate_store", dup_store)):
            rate = measure(series[key], make(run), pid)
            log(f"   run {run + 1}: {series[key].name:56s} {rate:8.0f} msg/s")
    return series


# ----------------------------------------------------------------------------- 4. store


def store_op(prefix: str, *, noop: bool = False) -> Callable[[int], None]:
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE, NOOP_CONSUMER, NOOP_EVENT_TYPE
    from django_inbox import store

    consumer, event_type = (NOOP_CONSUMER, NOOP_EVENT_TYPE) if noop else (CONSUMER, EVENT_TYPE)

    def op(i: int) -> None:
        if not store(
            consumer=consumer, message_id=f"{prefix}-{i}", event_type=event_type, payload=payload(i)
        ):
            raise RuntimeError("store() found a duplicate of a new id")

    return op


def bench_store() -> dict[str, Series]:
    log(f"\n== 4. store() of new messages, one transaction each: {RUNS} runs x {N}")
    series = Series("store(), one transaction per message")
    pid = django_backend_pid()
    for run in range(RUNS):
        truncate_inbox()
        rate = measure(series, store_op(f"s{run}"), pid)
        log(f"   run {run + 1}: {series.name:56s} {rate:8.0f} msg/s")
    truncate_inbox()
    return {"store_single": series}


# ----------------------------------------------------------------------------- 2. drain


def store_batch(series: Series | None, prefix: str, count: int, *, noop: bool = False) -> float:
    """``store()`` ``count`` new messages inside one transaction; return messages/s."""
    from django.db import transaction

    op = store_op(prefix, noop=noop)
    began = time.perf_counter()
    with transaction.atomic():
        run_ops(op, count)
    rate = count / (time.perf_counter() - began)
    if series is not None:
        series.rates.append(rate)
    return rate


def pending_count() -> int:
    return int(
        bench_sql(
            "SELECT count(*) FROM django_inbox_inboxmessage WHERE consumer LIKE 'bench%' "
            "AND status <> 'completed'"
        )[0][0]
    )


def completed_count() -> int:
    return int(
        bench_sql(
            "SELECT count(*) FROM django_inbox_inboxmessage WHERE consumer = 'bench' "
            "AND status = 'completed'"
        )[0][0]
    )


def drain_in_process(
    series: Series,
    stored: Series,
    label: str,
    count: int,
    *,
    persistent: bool = False,
    options: dict[str, Any] | None = None,
    noop: bool = False,
    worker_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Store ``count`` messages, drain them with ``Worker.run()`` in this process.

    ``persistent`` sets CONN_MAX_AGE=None for the drain; ``options`` adds Django OPTIONS;
    ``noop`` uses the consumer whose handler does nothing.
    """
    from django.db import connections
    from django.db.backends.signals import connection_created

    from bench.inbox_handlers import CONSUMER, NOOP_CONSUMER
    from django_inbox.worker import Worker

    truncate_inbox()
    store_batch(stored, label, count, noop=noop)
    vacuum()  # what autovacuum's ANALYZE would do after a bulk insert
    batches: list[tuple[float, int]] = []

    class TimedWorker(Worker):
        """The real worker; it only notes when each batch ended (one clock read a batch)."""

        def run_once(self) -> int:
            handled = super().run_once()
            batches.append((time.perf_counter(), handled))
            return handled

    connects = Counter[str]()

    def on_connect(**_: Any) -> None:
        connects["opened"] += 1

    conn = connections["default"]
    saved_age = conn.settings_dict.get("CONN_MAX_AGE", 0)
    backend = None
    with django_options(options):
        if persistent:
            conn.close()
            conn.settings_dict["CONN_MAX_AGE"] = None
            backend = django_backend_pid()
        connection_created.connect(on_connect)
        try:
            worker = TimedWorker(
                consumers=[NOOP_CONSUMER if noop else CONSUMER],
                until_idle=0,
                **(worker_options or {}),
            )
            began = time.perf_counter()
            with measuring(series, count, backend):
                stats = worker.run()
        finally:
            connection_created.disconnect(on_connect)
            conn.close()
            conn.settings_dict["CONN_MAX_AGE"] = saved_age
    if stats.outcomes.get("processed") != count or pending_count():
        raise RuntimeError(f"the drain did not process every message: {dict(stats.outcomes)}")

    done, marks = 0, [(began, 0)]
    for at, handled in batches:
        done += handled
        marks.append((at, done))

    def rate_between(lo: int, hi: int) -> float:
        t0 = next(at for at, d in marks if d >= lo)
        t1 = next(at for at, d in marks if d >= hi)
        return round((hi - lo) / (t1 - t0), 1) if t1 > t0 else 0.0

    tenth = max(1, count // 10)
    return {
        "messages": count,
        "msg_s": round(series.rates[-1], 1),
        "batches": len(batches),
        "connections_opened": connects["opened"] + (1 if persistent else 0),
        "first_tenth_msg_s": rate_between(0, tenth),
        "last_tenth_msg_s": rate_between(count - tenth, count),
        "load_average": loadavg(),
    }


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = DATABASE_URL
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "testproject")])
    return env


INBOX_PROCESS = [str(MANAGE), "inbox_process", "--consumer", "bench", "--until-idle", "0"]


def run_inbox_process(workers: int) -> tuple[float, float, float]:
    """Start ``workers`` ``manage.py inbox_process`` at once; (wall s, their CPU s, machine
    CPU s)."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0 = machine_busy()
    began = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, *INBOX_PROCESS, "--verbosity", "0"], env=subprocess_env())
        for _ in range(workers)
    ]
    codes = [proc.wait() for proc in procs]
    wall = time.perf_counter() - began
    busy = machine_busy() - busy0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if any(codes):
        raise RuntimeError(f"inbox_process exited with {codes}")
    return wall, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), busy


def bench_drain() -> dict[str, Series]:
    from django_inbox.worker import Worker

    small = max(1000, DRAIN_N // 10)
    log(
        f"\n== 2. drain: store() {DRAIN_N} messages in one transaction, drain them with the "
        f"worker ({DRAIN_RUNS} in-process runs, then inbox_process subprocesses)"
    )
    series = {
        "drain_in_process": Series("drain: Worker.run() in process"),
        "drain_subprocess": Series("drain: 1 manage.py inbox_process (wall clock)"),
        "drain_subprocess_net": Series("drain: 1 inbox_process, start-up excluded"),
        "drain_2_subprocesses": Series("drain: 2 inbox_process at once (wall clock, info)"),
        "drain_small": Series(f"drain in process, {small} msgs, as configured (info)"),
        "drain_persistent": Series(f"drain in process, {small} msgs, CONN_MAX_AGE=None (info)"),
        "drain_tuned": Series(
            f"drain in process, {small} msgs, CONN_MAX_AGE=None + prepared statements (info)"
        ),
        "drain_noop": Series(f"drain in process, {small} msgs, empty handler (info)"),
        "store_batched": Series("store() x N inside one transaction (info)"),
    }
    details = []
    for run in range(DRAIN_RUNS):
        info = drain_in_process(
            series["drain_in_process"], series["store_batched"], f"q{run}", DRAIN_N
        )
        details.append(info)
        log(
            f"   run {run + 1}: stored at {series['store_batched'].rates[-1]:6.0f} msg/s, "
            f"drained at {info['msg_s']:6.0f} msg/s  {info}"
        )
    series["drain_in_process"].extra["runs_detail"] = details

    # What the worker's connection handling and Django's unprepared statements cost: the same
    # drain as configured, with a persistent connection, and with prepared statements too,
    # interleaved over RUNS rounds.
    # The empty handler shows what the inbox machinery alone allows. A worker that can run
    # several messages per transaction (``commit_every``) is measured doing so as well.
    variants: list[tuple[str, bool, dict[str, Any] | None, bool, dict[str, Any] | None]] = [
        ("drain_small", False, None, False, None),
        ("drain_persistent", True, None, False, None),
        ("drain_tuned", True, PREPARED, False, None),
        ("drain_noop", False, None, True, None),
    ]
    if "commit_every" in inspect.signature(Worker).parameters:
        series["drain_commit_every"] = Series(
            f"drain in process, {small} msgs, Worker(commit_every=100) (info)"
        )
        variants.append(("drain_commit_every", False, None, False, {"commit_every": 100}))
    for run in range(RUNS):
        for key, persistent, options, noop, worker_options in variants:
            info = drain_in_process(
                series[key],
                series["store_batched"],
                f"{key}{run}",
                small,
                persistent=persistent,
                options=options,
                noop=noop,
                worker_options=worker_options,
            )
            series[key].extra.setdefault("runs_detail", []).append(info)
            log(f"   run {run + 1}: {series[key].name:66s} {info['msg_s']:6.0f} msg/s")

    # Subprocesses: start-up (interpreter, Django set-up, autodiscovery, first connection) is
    # measured on an empty inbox and reported apart.
    truncate_inbox()
    startup = statistics.median(run_inbox_process(1)[0] for _ in range(3))
    for key, workers, prefix in (("drain_subprocess", 1, "qs"), ("drain_2_subprocesses", 2, "qt")):
        truncate_inbox()
        store_batch(series["store_batched"], prefix, DRAIN_N)
        vacuum()
        wall, cpu, busy = run_inbox_process(workers)
        if pending_count() or completed_count() != DRAIN_N:
            raise RuntimeError("inbox_process did not complete every message")
        series[key].add(DRAIN_N, wall, cpu, None, busy)
        series[key].extra.update(seconds=round(wall, 2), workers=workers, load_average=loadavg())
        log(
            f"   {workers} subprocess(es): {DRAIN_N} in {wall:.1f}s = {DRAIN_N / wall:.0f} msg/s "
            f"(start-up {startup:.2f}s)"
        )
        if workers == 1:
            series["drain_subprocess"].extra["startup_seconds"] = round(startup, 3)
            series["drain_subprocess_net"].add(DRAIN_N, max(wall - startup, 1e-6), None, None)
    truncate_inbox()
    return series


# ----------------------------------------------------------------------------- 5. consume

CONSUME_SCRIPT = BENCH_DIR / "consume.py"
CONSUME_IDLE = 2  # --until-idle of every consumer: it exits 2 s after the last message
SAMPLE_EVERY = 0.02  # s between two reads of the consumer's and its backend's CPU time


def broker_reachable(url: str) -> str | None:
    """``None`` if the broker answers, else why not."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # any failure means: skip this broker
        return f"{type(exc).__name__}: {exc}"
    return None


class Queues:
    """The broker queues this run declared (all named ``bench-…``), deleted at the end."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []

    def new(self, url: str, label: str) -> str:
        name = f"bench-{label}-{os.getpid()}-{len(self.made)}"
        self.made.append((url, name))
        return name

    def delete_all(self) -> None:
        from kombu import Connection, Queue

        for url, name in self.made:
            try:
                with Connection(url) as conn:
                    queue = Queue(name, routing_key=name, durable=True)(conn.default_channel)
                    queue.declare()  # kombu's virtual transports delete the bindings they know
                    queue.delete()
            except Exception as exc:  # best effort: report, go on with the others
                log(f"   could not delete queue {name} at {url}: {exc}")
        self.made.clear()


def publish(url: str, queue: str, prefix: str, count: int) -> float:
    """Publish ``count`` persistent messages ``{prefix}-{i}`` of type ``bench.take`` into
    ``queue`` (declared here, as the consumers declare it); return messages/s."""
    from kombu import Connection, Queue

    from bench.inbox_handlers import EVENT_TYPE

    began = time.perf_counter()
    with Connection(url) as conn:
        channel = conn.default_channel
        target = Queue(queue, routing_key=queue, durable=True)(channel)
        target.declare()
        target.purge()
        producer = conn.Producer(channel)
        for i in range(count):
            producer.publish(
                json.dumps(payload(i)),
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                message_id=f"{prefix}-{i}",
                type=EVENT_TYPE,
            )
    return count / (time.perf_counter() - began)


def queue_depth(url: str, queue: str) -> int:
    from kombu import Connection, Queue

    with Connection(url) as conn:
        channel = conn.default_channel
        if url.startswith("redis"):  # an empty Redis list does not exist: no passive declare
            return int(channel.client.llen(queue))
        declared = Queue(queue, routing_key=queue, durable=True)(channel)
        return int(declared.queue_declare(passive=True).message_count)


def inbox_rows(status: str) -> tuple[int, dt.datetime | None, dt.datetime | None, int]:
    """(rows, first received_at, last received_at, rows in ``status``) of consumer ``bench``."""
    if status not in ("received", "completed"):
        raise ValueError(status)
    row = bench_sql(
        "SELECT count(*), min(received_at), max(received_at), "
        f"count(*) FILTER (WHERE status = '{status}') "
        "FROM django_inbox_inboxmessage WHERE consumer = 'bench'"
    )[0]
    return int(row[0]), row[1], row[2], int(row[3])


def sessions(conn: psycopg.Connection[Any]) -> int:
    """Sessions ever opened to the bench database (PostgreSQL 14+; counted at connect)."""
    cur = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", [DB_NAME])
    row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def server_pids(command: str) -> list[int]:
    """Processes of this machine named ``command`` (the broker's server: its CPU time is read
    from /proc like the consumer's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == command:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def backend_pids(conn: psycopg.Connection[Any], application_name: str) -> list[int]:
    cur = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application_name]
    )
    return [int(r[0]) for r in cur.fetchall()]


def interpolate(samples: list[tuple[float, ...]], at: float, column: int) -> float | None:
    """Column ``column`` of ``samples`` (sorted by time, column 0) at time ``at``."""
    previous = None
    for sample in samples:
        if sample[0] >= at:
            if previous is None or sample[column] is None or previous[column] is None:
                return sample[column]
            span = sample[0] - previous[0]
            share = (at - previous[0]) / span if span else 1.0
            return previous[column] + share * (sample[column] - previous[column])
        previous = sample
    return previous[column] if previous else None


def run_consumer(
    kind: str,
    url: str,
    queue: str,
    *,
    ack: str = "after-process",
    prefetch: int,
    conn_max_age: str = "none",
    pyspy: Path | None = None,
    cprofile: Path | None = None,
    max_messages: int | None = None,
    commit_every: int | None = None,
) -> dict[str, Any]:
    """Start one consumer subprocess on ``queue`` (already filled) and wait for it to exit.

    ``kind`` ``inbox`` is ``manage.py inbox_consume``, ``plain`` the kombu baseline
    (``bench/consume.py plain``). While it runs, this process reads every 20 ms the CPU time
    of the consumer, of its PostgreSQL backend (found by ``application_name``) and of the
    machine; the figures are taken between the start of the first and of the last message
    (the inbox's ``received_at``, the baseline's own clock), so the consumer's start-up and
    its final idle wait are excluded. Profiled runs (``pyspy``, ``cprofile``) are not timed.
    """
    application_name = f"bench-consume-{kind}-{time.monotonic_ns()}"
    env = subprocess_env()
    env.update(
        INBOX_BROKER_URL=url,
        BENCH_CONN_MAX_AGE=conn_max_age,
        BENCH_DB_APPLICATION_NAME=application_name,
    )
    common = ["--queue", queue, "--broker", url, "--prefetch", str(prefetch)]
    common += ["--until-idle", str(CONSUME_IDLE)]
    if max_messages:
        common += ["--max-messages", str(max_messages)]
    if kind == "inbox" and cprofile is None:
        cmd = [sys.executable, str(MANAGE), "inbox_consume", "--consumer", "bench"]
        cmd += [*common, "--ack", ack]
        if commit_every:
            cmd += ["--commit-every", str(commit_every)]
    else:
        cmd = [sys.executable, str(CONSUME_SCRIPT), kind, *common, "--ack", ack]
        if cprofile is not None:
            cmd += ["--profile", str(cprofile)]
    if pyspy is not None:
        spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--rate", "400", "--idle"]
        cmd = [*spy, "--format", "raw", "-o", str(pyspy), "--", *cmd]
    samples: list[tuple[Any, ...]] = []
    backends: set[int] = set()
    broker_pids = server_pids("redis-server" if url.startswith("redis") else "beam.smp")
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        psycopg.connect(BENCH_DSN, autocommit=True) as watch,
    ):
        sessions0 = sessions(watch)
        started = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        backend: int | None = None
        next_lookup = 0.0
        while proc.poll() is None:
            now = time.time()
            if now >= next_lookup:
                # every sample until the backend is found, then twice a second
                found = backend_pids(watch, application_name)
                backends.update(found)
                backend = found[0] if len(found) == 1 else None
                next_lookup = now + (0.5 if backend else 0.0)
            server = proc_cpu(backend) if backend else None
            broker_cpu = sum(proc_cpu(pid) for pid in broker_pids) if broker_pids else None
            samples.append((now, proc_cpu(proc.pid), server, machine_busy(), broker_cpu))
            time.sleep(SAMPLE_EVERY)
        ended = time.time()
        connections = sessions(watch) - sessions0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{stderr[-2000:]}")
    if kind == "plain":
        found_json = json.loads([s for s in stdout.splitlines() if s.startswith("{")][-1])
        count, first, last = found_json["count"], found_json["first"], found_json["last"]
        completed = count
    else:
        status = "received" if ack == "after-store" else "completed"
        count, first_at, last_at, completed = inbox_rows(status)
        first = first_at.timestamp() if first_at else None
        last = last_at.timestamp() if last_at else None
        if kind == "inbox" and cprofile is None:
            acked = re.search(r"acked (\d+)", stdout)
            if not acked or int(acked.group(1)) != count or "requeued 0" not in stdout:
                raise RuntimeError(f"inbox_consume did not ack every message: {stdout.strip()}")
    if first is None or last is None or last <= first:
        raise RuntimeError(f"{kind} consumer handled {count} messages: {stdout} {stderr[-500:]}")
    window = last - first
    timed = pyspy is None and cprofile is None
    client = server = busy = broker = None
    if timed:
        c0, c1 = interpolate(samples, first, 1), interpolate(samples, last, 1)
        client = c1 - c0 if c0 is not None and c1 is not None else None
        if len(backends) == 1:  # one backend for the whole run: its CPU is the consumer's
            s0, s1 = interpolate(samples, first, 2), interpolate(samples, last, 2)
            # not seen yet at the first message: it connected during that message (or a
            # sample before), so its CPU time then was (about) none
            server = s1 - (s0 or 0.0) if s1 is not None else None
        b0, b1 = interpolate(samples, first, 3), interpolate(samples, last, 3)
        busy = b1 - b0 if b0 is not None and b1 is not None else None
        r0, r1 = interpolate(samples, first, 4), interpolate(samples, last, 4)
        broker = r1 - r0 if r0 is not None and r1 is not None else None
    return {
        "kind": kind,
        "count": count,
        "completed": completed,
        "intervals": count - 1,
        "window_s": window,
        "msg_s": (count - 1) / window,
        "client_cpu_s": client,
        "server_cpu_s": server,
        "machine_busy_s": busy,
        "broker_cpu_s": broker,
        "backends_seen": len(backends),
        "connections_opened": connections,
        "startup_s": first - started,
        "process_wall_s": ended - started,
        "stdout": stdout.strip()[-300:],
    }


class ConsumeBench:
    """Section 5: broker → consumer → handler → ack, inbox_consume against plain kombu."""

    def __init__(self, queues: Queues) -> None:
        from django_inbox.conf import inbox_settings

        self.queues = queues
        self.prefetch = inbox_settings.prefetch
        self.series: dict[str, Series] = {}
        self.runs: list[dict[str, Any]] = []

    def measure(
        self,
        key: str,
        name: str,
        kind: str,
        url: str,
        count: int,
        *,
        ack: str = "after-process",
        prefetch: int | None = None,
        conn_max_age: str = "none",
        commit_every: int | None = None,
    ) -> dict[str, Any]:
        series = self.series.setdefault(key, Series(name))
        truncate_inbox()
        queue = self.queues.new(url, key)
        published = publish(url, queue, f"{key}-{len(series.rates)}", count)
        info = run_consumer(
            kind,
            url,
            queue,
            ack=ack,
            prefetch=prefetch or self.prefetch,
            conn_max_age=conn_max_age,
            commit_every=commit_every,
        )
        left = queue_depth(url, queue)
        if info["count"] != count or info["completed"] != count or left:
            raise RuntimeError(f"{name}: {info['count']} of {count} handled, {left} left: {info}")
        series.add(
            info["intervals"],
            info["window_s"],
            info["client_cpu_s"],
            info["server_cpu_s"],
            info["machine_busy_s"],
        )
        details = {
            "messages": count,
            "msg_s": round(info["msg_s"], 1),
            "published_msg_s": round(published, 1),
            "startup_s": round(info["startup_s"], 2),
            "process_wall_s": round(info["process_wall_s"], 2),
            "postgresql_connections_opened": info["connections_opened"],
            "broker_cpu_us_per_msg": round(info["broker_cpu_s"] / info["intervals"] * 1e6, 1)
            if info["broker_cpu_s"] is not None
            else None,
            "load_average": loadavg(),
        }
        series.extra.setdefault("runs_detail", []).append(details)
        broker_cpu = [
            d["broker_cpu_us_per_msg"]
            for d in series.extra["runs_detail"]
            if d["broker_cpu_us_per_msg"] is not None
        ]
        if broker_cpu:
            series.extra["broker_cpu_us_per_msg"] = round(statistics.median(broker_cpu), 1)
        series.extra.update(
            kind=kind,
            broker=url.split(":")[0],
            ack=ack,
            prefetch=prefetch or self.prefetch,
            conn_max_age=conn_max_age,
            messages=count,
        )
        log(
            f"   {name:66s} {info['msg_s']:7.0f} msg/s  (start-up {info['startup_s']:.2f}s, "
            f"published at {published:.0f}/s, {info['connections_opened']} PostgreSQL "
            "connection(s))"
        )
        return info

    def profile(self, kind: str, url: str, count: int, how: str, tmp: Path) -> dict[str, Any]:
        """One untimed run of ``kind`` under py-spy (the real process) or cProfile."""
        truncate_inbox()
        queue = self.queues.new(url, f"profile-{kind}")
        publish(url, queue, f"profile-{kind}-{how}", count)
        path = tmp / f"{kind}.{how}"
        info = run_consumer(
            kind,
            url,
            queue,
            prefetch=self.prefetch,
            pyspy=path if how == "py-spy" else None,
            cprofile=path if how == "cprofile" else None,
            max_messages=count,  # no --until-idle wait at the end of the profile
        )
        if how == "py-spy":
            return pyspy_breakdown(path.read_text(), kind, count, 1e6 / info["msg_s"])
        stats = pstats.Stats(str(path))
        found = summarise(stats, count)
        found["calls_per_msg"] = call_counts(stats, count)
        found["cumulative"] = cumulative(stats, count)
        found["json_loads_callers"] = callers(stats, "loads", "json/__init__.py", count)
        found["json_dumps_callers"] = callers(stats, "dumps", "json/__init__.py", count)
        return found


def bench_consume() -> tuple[dict[str, Series], dict[str, Any]]:
    """RabbitMQ (and Redis) → consumer → the bench handler → ack, in one consumer process."""
    n, half, small = CONSUME_N, max(1000, CONSUME_N // 2), max(500, CONSUME_N // 10)
    log(
        f"\n== 5. broker consumers: {CONSUME_RUNS} interleaved runs x {n} messages, "
        f"inbox_consume against a plain kombu consumer"
    )
    down = {name: broker_reachable(url) for name, url in BROKERS.items()}
    for name, why in down.items():
        if why:
            log(f"   {name} at {BROKERS[name]} is not reachable ({why}): skipped")
    queues = Queues()
    bench = ConsumeBench(queues)
    extra: dict[str, Any] = {"skipped": {k: v for k, v in down.items() if v}}
    rabbit, redis = BROKERS["rabbitmq"], BROKERS["redis"]
    try:
        if not down["rabbitmq"]:
            pair = [
                ("consume_rabbitmq", "RabbitMQ → manage.py inbox_consume, ack after process"),
                ("consume_rabbitmq_plain", "RabbitMQ → plain kombu consumer, same handler"),
                (
                    "consume_rabbitmq_batched",
                    "RabbitMQ → inbox_consume --commit-every 100 (batched commits)",
                ),
            ]
            for run in range(CONSUME_RUNS):
                # interleaved, the order alternating, so a trend in the machine's load
                # favours none
                for key, name in pair if run % 2 == 0 else pair[::-1]:
                    kind = "plain" if key.endswith("plain") else "inbox"
                    batched = 100 if key.endswith("batched") else None
                    bench.measure(key, name, kind, rabbit, n, commit_every=batched)
            bench.measure(
                "consume_rabbitmq_store",
                f"RabbitMQ → inbox_consume --ack after-store, {half} msgs (info)",
                "inbox",
                rabbit,
                half,
                ack="after-store",
            )
            bench.measure(
                "consume_rabbitmq_prefetch1",
                f"RabbitMQ → inbox_consume, prefetch 1, {half} msgs (info)",
                "inbox",
                rabbit,
                half,
                prefetch=1,
            )
            bench.measure(
                "consume_rabbitmq_plain_prefetch1",
                f"RabbitMQ → plain kombu, prefetch 1, {half} msgs (info)",
                "plain",
                rabbit,
                half,
                prefetch=1,
            )
            bench.measure(
                "consume_rabbitmq_age0",
                f"RabbitMQ → inbox_consume, CONN_MAX_AGE=0, {small} msgs (info)",
                "inbox",
                rabbit,
                small,
                conn_max_age="0",
            )
            bench.measure(
                "consume_rabbitmq_plain_age0",
                f"RabbitMQ → plain kombu, CONN_MAX_AGE=0, {small} msgs (info)",
                "plain",
                rabbit,
                small,
                conn_max_age="0",
            )
        if not down["redis"]:
            pair = [
                ("consume_redis", f"Redis → inbox_consume, ack after process, {half} msgs (info)"),
                ("consume_redis_plain", f"Redis → plain kombu consumer, {half} msgs (info)"),
            ]
            for run in range(min(2, CONSUME_RUNS)):
                for key, name in pair if run % 2 == 0 else pair[::-1]:
                    kind = "plain" if key.endswith("plain") else "inbox"
                    bench.measure(key, name, kind, redis, half)
        if not down["rabbitmq"]:
            extra["profiles"] = consume_profiles(bench, rabbit)
    finally:
        queues.delete_all()
        truncate_inbox()
    extra["prefetch_default"] = bench.prefetch
    return bench.series, extra


def consume_profiles(bench: ConsumeBench, url: str) -> dict[str, Any]:
    count = CONSUME_PROFILE_N
    log(
        f"   profiling (untimed): py-spy on inbox_consume and the plain consumer, twice each, "
        f"{count} messages a run, then cProfile of both"
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if (Path(sys.executable).parent / "py-spy").exists():
            # twice each (inbox, plain, plain, inbox): the machine is shared, so keep each
            # consumer's least disturbed run, the one with the lowest wall time per message
            for kind in ("inbox", "plain", "plain", "inbox"):
                found = bench.profile(kind, url, count, "py-spy", Path(tmp))
                key = f"{kind}_py-spy"
                walls = [
                    *out.get(key, {}).get("runs_wall_us_per_msg", []),
                    found["wall_us_per_msg"],
                ]
                if key not in out or found["wall_us_per_msg"] < out[key]["wall_us_per_msg"]:
                    out[key] = found
                out[key]["runs_wall_us_per_msg"] = walls
                top = ", ".join(
                    f"{label} {step['share']:.0%}"
                    for label, step in list(found["steps"].items())[:5]
                )
                log(
                    f"   py-spy {kind:6s} {found['wall_us_per_msg']:5.0f} µs/msg, "
                    f"{found['samples']} samples: {top}"
                )
        else:
            log("   py-spy is not installed in .venv: skipped (pip install py-spy)")
        for kind in ("inbox", "plain"):
            found = bench.profile(kind, url, count, "cprofile", Path(tmp))
            out[f"{kind}_cprofile"] = found
            log(
                f"   cProfile {kind:6s} {found['profiled_us_per_msg']:.0f} µs/msg profiled; per "
                f"message: {found['calls_per_msg']}"
            )
    return out


# What a consumer does per message, from py-spy's stacks: the step a sample belongs to is the
# first of these frames found under the per-message callback (root to leaf). (function name
# ends with, file contains, label).
STEPS: list[tuple[str, str, str]] = [
    ("close_old_connections", "django/db/", "close_old_connections()"),
    ("parse", "consumer/envelope.py", "envelope: read properties, decode body and headers"),
    ("loads", "json/", "json.loads of the body"),
    ("_prepare", "django_inbox/delivery.py", "deliver: _prepare (validate, JSON-encode)"),
    ("get", "django_inbox/registry.py", "deliver: registry lookup"),
    ("insert_row", "django_inbox/storage.py", "deliver: inbox INSERT (insert_row)"),
    ("_materialise", "django_inbox/delivery.py", "deliver: build InboxMessage (_materialise)"),
    ("take_one", "bench/inbox_handlers.py", "handler: ORM UPDATE (take_one)"),
    ("__enter__", "django/db/transaction.py", "atomic() enter (BEGIN is sent with the 1st query)"),
    ("__exit__", "django/db/transaction.py", "atomic() exit: COMMIT"),
    ("now", "django/utils/timezone.py", "timezone.now()"),
    ("ack", "kombu/message.py", "message.ack()"),
]
ROOTS = {
    # per-message callback, the consuming loop
    "inbox": ("_on_message", "run"),
    "plain": ("on_message", "plain"),
}


def _frame(text: str) -> tuple[str, str]:
    """``name (file:line)`` of py-spy's raw output → (name, file)."""
    found = re.match(r"(.*) \((.*?)(?::\d+)?\)$", text)
    return (found.group(1), found.group(2)) if found else (text, "")


def _waiting_for(name: str, file: str) -> str | None:
    """What a sample whose innermost Python frame is ``name`` in ``file`` is waiting for."""
    if "psycopg/" in file and name.endswith("wait"):
        return "PostgreSQL"  # psycopg blocks in wait_c (C) until the server answers
    if ("amqp/transport.py" in file and name.endswith("_read")) or (
        "kombu/utils/eventio.py" in file or ("redis/" in file and "read" in name)
    ):
        return "broker"  # socket reads: returns at once when a frame is buffered
    return None


def pyspy_breakdown(raw: str, kind: str, count: int, wall_us: float) -> dict[str, Any]:
    """Wall-clock samples of one consumer (py-spy ``--idle``, raw format) per step of a
    message, and how much of each step waited for PostgreSQL or the broker."""
    per_message, loop = ROOTS[kind]
    steps: Counter[str] = Counter()
    pg_wait: Counter[str] = Counter()
    waits: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, number = line.rpartition(" ")
        if not number.isdigit():
            continue
        frames = [_frame(f) for f in stack.split(";")]
        names = [name.rsplit(".", 1)[-1] for name, _ in frames]
        if not any(
            name == loop and ("consume" in file or "loop.py" in file)
            for name, (_, file) in zip(names, frames, strict=True)
        ):
            continue  # start-up, imports, Django set-up, exit
        samples = int(number)
        total += samples
        leaf_name, leaf_file = frames[-1]
        waiting = _waiting_for(leaf_name, leaf_file)
        if waiting:
            waits[waiting] += samples
        else:
            leaves[f"{leaf_name} ({_short(leaf_file)})"] += samples
        if per_message not in names:
            if "_between_messages" in names:
                label = "loop: _between_messages (sweep for due retries once a second)"
            elif "drain_events" in names:
                label = "broker: read frames, build the kombu message"
            else:
                label = "loop: other (_finished, timeouts)"
        else:
            label = "per message: other"
            for name, file in frames[names.index(per_message) + 1 :]:
                hit = next(
                    (lab for end, where, lab in STEPS if name.endswith(end) and where in file), None
                )
                if hit:
                    label = hit
                    break
        steps[label] += samples
        if waiting == "PostgreSQL":
            pg_wait[label] += samples
    if not total:
        return {"messages": count, "samples": 0, "steps": {}}
    return {
        "messages": count,
        "samples": total,
        "wall_us_per_msg": round(wall_us, 1),
        "waiting_share": {k: round(v / total, 3) for k, v in waits.most_common()},
        "steps": {
            k: {
                "share": round(v / total, 3),
                "waiting_for_postgresql": round(pg_wait[k] / total, 3),
            }
            for k, v in steps.most_common()
        },
        "top_leaf_functions_not_waiting": [
            {"where": k, "share": round(v / total, 3)} for k, v in leaves.most_common(12)
        ],
    }


def _short(file: str) -> str:
    file = re.sub(r"^.*/(site-packages|lib/python3\.\d+)/", "", file)
    return file.replace(str(ROOT) + "/", "")


# Per message, counted by cProfile: (label, function name, file contains).
CALLS: list[tuple[str, str, str]] = [
    ("SQL statements (psycopg execute)", "execute", "psycopg/cursor.py"),
    ("SQL statements (psycopg client cursor execute)", "execute", "psycopg/client_cursor.py"),
    ("commits", "commit", "psycopg/connection.py"),
    ("close_old_connections", "close_old_connections", "django/db/__init__.py"),
    ("acks", "ack", "kombu/message.py"),
    ("json.loads", "loads", "json/__init__.py"),
    ("json.dumps", "dumps", "json/__init__.py"),
    ("Django settings lookups (LazySettings.__getattr__)", "__getattr__", "django/conf/__init__"),
    ("model __init__", "__init__", "django/db/models/base.py"),
    ("amqp frames read", "read_frame", "amqp/transport.py"),
    ("drain_events", "drain_events", "kombu/connection.py"),
]


# Cumulative time per message under cProfile: (function name, file contains).
CUMULATIVE: list[tuple[str, str]] = [
    ("_on_message", "django_inbox/consumer/loop.py"),
    ("on_message", "bench/consume.py"),
    ("parse", "django_inbox/consumer/envelope.py"),
    ("deliver", "django_inbox/delivery.py"),
    ("_prepare", "django_inbox/delivery.py"),
    ("insert_row", "django_inbox/storage.py"),
    ("_materialise", "django_inbox/delivery.py"),
    ("take_one", "bench/inbox_handlers.py"),
    ("commit", "django/db/backends/base/base.py"),
    ("ack", "kombu/message.py"),
    ("close_old_connections", "django/db/__init__.py"),
    ("_between_messages", "django_inbox/consumer/loop.py"),
    ("run_once", "django_inbox/worker.py"),
    ("drain_events", "kombu/connection.py"),
]


def call_counts(stats: pstats.Stats, count: int) -> dict[str, float]:
    found: Counter[str] = Counter()
    for (filename, _line, func), (_cc, ncalls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        for label, name, where in CALLS:
            if func == name and where in filename:
                found[label] += ncalls
    return {label: round(found[label] / count, 2) for label, _, _ in CALLS if found[label]}


def callers(stats: pstats.Stats, name: str, where: str, count: int) -> dict[str, float]:
    """Who calls function ``name`` (file containing ``where``), calls per message each."""
    out: Counter[str] = Counter()
    for (filename, _line, func), (*_rest, calling) in stats.stats.items():  # type: ignore[attr-defined]
        if func == name and where in filename:
            for (c_file, c_line, c_func), (_cc, ncalls, *_x) in calling.items():
                out[_where(c_file, c_line, c_func)] += ncalls
    return {k: round(v / count, 2) for k, v in out.most_common()}


def cumulative(stats: pstats.Stats, count: int) -> dict[str, dict[str, float]]:
    """Calls and cumulative µs per message of the functions a consumed message goes through
    (under cProfile, which inflates them: compare them with each other)."""
    out = {}
    for (filename, line, func), (_cc, ncalls, _tt, cumtime, _cl) in stats.stats.items():  # type: ignore[attr-defined]
        for name, where in CUMULATIVE:
            if func == name and where in filename:
                out[_where(filename, line, func)] = {
                    "calls_per_msg": round(ncalls / count, 3),
                    "cumulative_us_per_msg": round(cumtime / count * 1e6, 1),
                }
    return out


# ----------------------------------------------------------------------------- round trips


def trace_lines(fn: Callable[[], object], pgconn: Any) -> list[str]:
    """Run ``fn`` with libpq tracing on ``pgconn``; return the protocol messages."""
    with tempfile.NamedTemporaryFile("w+", suffix=".trace") as fh:
        pgconn.trace(fh.fileno())
        pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            fn()
        finally:
            pgconn.untrace()
        fh.seek(0)
        return fh.read().splitlines()


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
    from django_inbox.attempts import process_claimed
    from django_inbox.claims import claim_batch
    from django_inbox.worker import Worker

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


# ----------------------------------------------------------------------------- profiles

WAITING = "waiting for PostgreSQL"
WAITING_BROKER = "waiting for the broker (socket reads)"


def profile(fn: Callable[[], object], count: int) -> dict[str, Any]:
    profiler = cProfile.Profile()
    profiler.runcall(fn)
    return summarise(pstats.Stats(profiler), count)


def summarise(stats: pstats.Stats, count: int) -> dict[str, Any]:
    """Profiled time per message, grouped, and the top Python functions by own time."""
    groups: Counter[str] = Counter()
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, _ct, _cl) in stats.stats.items():  # type: ignore[attr-defined]
        group = _group(filename, func)
        groups[group] += tottime
        if group not in (WAITING, WAITING_BROKER):
            rows.append((tottime, ncalls, _where(filename, line, func)))
    python = sum(t for g, t in groups.items() if g not in (WAITING, WAITING_BROKER))
    rows.sort(reverse=True)
    out = {
        "messages": count,
        "profiled_us_per_msg": round(sum(groups.values()) / count * 1e6, 1),
        "waiting_share": round(groups[WAITING] / sum(groups.values()), 3),
        "python_share_by_group": {
            g: round(t / python, 3)
            for g, t in groups.most_common()
            if g not in (WAITING, WAITING_BROKER)
        },
        "top_python_functions": [
            {"where": w, "calls_per_msg": round(nc / count, 2), "share": round(tt / python, 3)}
            for tt, nc, w in rows[:12]
        ],
    }
    if groups[WAITING_BROKER]:
        out["broker_waiting_share"] = round(groups[WAITING_BROKER] / sum(groups.values()), 3)
    return out


def _where(filename: str, line: int, func: str) -> str:
    if filename == "~":
        return func
    filename = re.sub(r"^.*/lib/python3\.\d+/(site-packages/)?", "", filename)
    filename = filename.replace(str(ROOT) + "/", "")
    return f"{filename}:{line}({func})"


def _group(filename: str, func: str) -> str:
    """Where the time goes, in buckets a reader can act on."""
    if (filename.endswith("psycopg/connection.py") and func == "wait") or "epoll" in func:
        return WAITING  # psycopg blocks in wait_c (C) inside this function
    if filename == "~" and re.search(r"'(recv|recv_into|poll|select)' of", func):
        return WAITING_BROKER  # py-amqp and redis-py read their sockets from Python
    if re.search(r"/(kombu|amqp|redis|vine)/", filename):
        return "kombu, py-amqp, redis-py (broker client)"
    if "psycopg" in filename or "psycopg" in func:
        return "psycopg (adapt, send, parse)"
    if "/django/db/models/" in filename:
        return "Django ORM (build and compile queries, model instances)"
    if "/django/db/" in filename:
        return "Django db layer (cursor wrappers, atomic)"
    if "/django/" in filename:
        return "Django other (settings, timezone, signals)"
    if "django_inbox/" in filename:
        return "django_inbox code"
    if "json" in filename or "json" in func:
        return "json"
    if "/bench/" in filename:
        return "bench harness"
    return "other Python (builtins, stdlib)"


def profiles() -> dict[str, Any]:
    from bench.inbox_handlers import CONSUMER
    from django_inbox.worker import Worker

    drain_n = PROFILE_N * 3
    log(
        f"\n== cProfile: deliver() x {PROFILE_N}, the same ids again (duplicates), bare "
        f"baseline x {PROFILE_N}, drain of {drain_n}"
    )
    truncate_inbox()
    first = deliver_op("p")
    duplicate = deliver_op("p", "duplicate")
    out = {
        "deliver": profile(lambda: run_ops(first, PROFILE_N), PROFILE_N),
        "duplicate_deliver": profile(lambda: run_ops(duplicate, PROFILE_N), PROFILE_N),
        "bare_django": profile(lambda: run_ops(bare_op, PROFILE_N), PROFILE_N),
    }
    truncate_inbox()
    store_batch(None, "pw", drain_n)
    vacuum()
    out["drain"] = profile(Worker(consumers=[CONSUMER], until_idle=0).run, drain_n)
    truncate_inbox()
    for name, found in out.items():
        groups = ", ".join(
            f"{g.split(' (')[0]} {share:.0%}"
            for g, share in list(found["python_share_by_group"].items())[:4]
        )
        log(f"   {name:18s} waiting {found['waiting_share']:.0%}; Python time: {groups}")
    return out


# ----------------------------------------------------------------------------- main


def main() -> int:
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
        consume_figures, consume = bench_consume()
        figures.update(consume_figures)
        wire = round_trips()
        prof = profiles()
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
    )
    log("\n" + table)
    log(
        f"\nwrote {RESULTS / 'latest.json'} and {RESULTS / 'latest.md'} "
        f"({facts['bench_seconds']:.0f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
