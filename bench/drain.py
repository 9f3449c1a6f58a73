"""Figure 2: draining stored messages, in process and with ``manage.py inbox_process``."""

from __future__ import annotations

import inspect
import os
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from bench.config import (
    DATABASE_URL,
    DRAIN_N,
    DRAIN_RUNS,
    DRAIN_SMALL,
    MANAGE,
    ROOT,
    RUNS,
    bench_sql,
    loadavg,
    log,
    truncate_inbox,
    vacuum,
)
from bench.dedup import store_op
from bench.timing import (
    PREPARED,
    Series,
    django_backend_pid,
    django_options,
    machine_busy,
    measuring,
    run_ops,
)

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
    from django_inbox.processing.worker import Worker

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
    from django_inbox.processing.worker import Worker

    small = DRAIN_SMALL
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
