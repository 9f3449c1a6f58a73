"""Timing a figure: series of runs; client, server and machine CPU per run; Django options
per run."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from bench.config import CLK_TCK, SKUS, WARMUP, N

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


def children(pid: int) -> list[int]:
    """The pids of process ``pid``'s children (a server's workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(child) for child in fh.read().split()]
    except OSError:
        return []


def server_cpu(pid: int) -> float:
    """CPU seconds of a server: its process and its workers (gunicorn's and Celery's prefork
    workers are children)."""
    return proc_cpu(pid) + sum(proc_cpu(child) for child in children(pid))


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
