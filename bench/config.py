"""Where the benchmark runs and with what: paths, knobs (``BENCH_*``), the database it
creates, the machine's facts."""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path
from typing import Any

from bench.common import code_version

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
MANAGE = ROOT / "testproject" / "manage.py"

DB_NAME = os.environ.get("BENCH_DB", "inbox_bench")
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
#: Messages of the smaller drains (figure 2's variants and figure 2c).
DRAIN_SMALL = max(1000, DRAIN_N // 10)
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

TARGETS: dict[str, Any] = {
    "deliver_vs_bare": 0.85,
    "drain": 5000.0,
    "duplicates": 10_000.0,
    "consume_vs_plain": 0.8,
    "consume": 2000.0,
    # The performance goals as ratios against baselines measured in the same run.
    "ratios": {
        "deliver_bare": 0.80,
        "deliver_raw_inbox": 0.70,
        "command_bare": 0.85,
        "command_procrastinate": 4.0,
        "commit_every_bare": 3.0,
        "duplicate_floor": 0.80,
        "consume_plain": 0.85,
        "age0_persistent": 0.90,
        "ordered_unordered": 0.80,
        # publish() adds at most 15% to a business transaction: 1 / 1.15.
        "publish_overhead": 0.87,
        "relay_kombu": 0.80,
    },
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
