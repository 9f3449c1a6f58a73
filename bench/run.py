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
``BENCH_KEEP_DB`` (0: drop ``inbox_bench`` at the end).
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
SKUS = 10_000  # stock rows the handler's updates are spread over: BENCH-0 … BENCH-9999
PROFILE_N = min(N, 3000)
CLK_TCK = os.sysconf("SC_CLK_TCK")

TARGETS = {"deliver_vs_bare": 0.85, "drain": 5000.0, "duplicates": 10_000.0}

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


def code_version() -> str:
    """The commit measured, and whether django_inbox/ had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "django_inbox"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return f"{head} + uncommitted changes in django_inbox/" if dirty else head


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
    from django_inbox.processing import claim_batch, process_claimed
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


def profile(fn: Callable[[], object], count: int) -> dict[str, Any]:
    profiler = cProfile.Profile()
    profiler.runcall(fn)
    stats = pstats.Stats(profiler)
    groups: Counter[str] = Counter()
    rows = []
    for (filename, line, func), (_cc, ncalls, tottime, _ct, _cl) in stats.stats.items():  # type: ignore[attr-defined]
        group = _group(filename, func)
        groups[group] += tottime
        if group != WAITING:
            rows.append((tottime, ncalls, _where(filename, line, func)))
    python = sum(t for g, t in groups.items() if g != WAITING)
    rows.sort(reverse=True)
    return {
        "messages": count,
        "profiled_us_per_msg": round(sum(groups.values()) / count * 1e6, 1),
        "waiting_share": round(groups[WAITING] / sum(groups.values()), 3),
        "python_share_by_group": {
            g: round(t / python, 3) for g, t in groups.most_common() if g != WAITING
        },
        "top_python_functions": [
            {"where": w, "calls_per_msg": round(nc / count, 2), "share": round(tt / python, 3)}
            for tt, nc, w in rows[:12]
        ],
    }


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
        },
        targets=TARGETS,
        figures={key: value.as_dict() for key, value in figures.items()},
        round_trips=wire,
        profiles=prof,
    )
    log("\n" + table)
    log(
        f"\nwrote {RESULTS / 'latest.json'} and {RESULTS / 'latest.md'} "
        f"({facts['bench_seconds']:.0f}s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
