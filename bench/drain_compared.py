"""Figure 2c: the drain as users run it (``manage.py inbox_process``, start-up included)
against a bare loop of ``atomic()`` transactions running the same handler in one process,
and against procrastinate draining jobs that run the same UPDATE. The three are interleaved,
A B C in every run, on the same number of messages."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

from bench.config import BENCH_DSN, DRAIN_SMALL, ROOT, RUNS, log, truncate_inbox, vacuum
from bench.deliver import bare_op
from bench.drain import completed_count, pending_count, run_inbox_process, store_batch
from bench.timing import Series, django_backend_pid, measuring, payload, run_ops

#: The virtualenv ``./scripts/bench`` makes for procrastinate (pinned there), and its version.
PROCRASTINATE_PYTHON = ROOT / ".bench-venv" / "procrastinate" / "bin" / "python"
PROCRASTINATE_SCRIPT = ROOT / "bench" / "procrastinate_drain.py"


def procrastinate_drain(series: Series, count: int) -> str | None:
    """Drain ``count`` procrastinate jobs in a subprocess; ``None``, or why it was skipped."""
    if not PROCRASTINATE_PYTHON.exists():
        return f"no {PROCRASTINATE_PYTHON.relative_to(ROOT)} (made by ./scripts/bench)"
    done = subprocess.run(
        [str(PROCRASTINATE_PYTHON), str(PROCRASTINATE_SCRIPT), BENCH_DSN, str(count)],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if done.returncode:
        return f"procrastinate_drain.py exited {done.returncode}: {done.stderr.strip()[-300:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["left"]:
        raise RuntimeError(f"procrastinate left {result['left']} jobs")
    series.add(count, result["seconds"], None, None)
    series.extra["version"] = result["version"]
    return None


#: Handlers per transaction of the batched bare loop: the floor of ``commit_every=100``.
BATCHED = 100


def _batched_op(i: int) -> None:
    """``BATCHED`` runs of the benchmark handler in one bare ``transaction.atomic()``: what a
    drain with ``commit_every=BATCHED`` could at best do, with no inbox at all."""
    from django.db import transaction

    from bench.inbox_handlers import take_one

    with transaction.atomic():
        for j in range(i * BATCHED, (i + 1) * BATCHED):
            take_one(SimpleNamespace(payload=payload(j)))


def bench_drain_compared() -> dict[str, Series]:
    count = DRAIN_SMALL
    log(
        f"\n== 2c. drain of {count} messages, interleaved: manage.py inbox_process (start-up "
        f"included) / a bare atomic() loop in process / procrastinate ({RUNS} runs)"
    )
    series = {
        "drain_command_small": Series(f"drain: manage.py inbox_process, {count} msgs (wall)"),
        "drain_bare_small": Series(f"bare atomic() loop, same handler, {count} msgs"),
        "drain_procrastinate": Series(f"procrastinate worker, same UPDATE, {count} jobs"),
        "drain_bare_batched": Series(
            f"bare atomic() loop of {BATCHED} handlers per transaction, {count} msgs"
        ),
    }
    pid = django_backend_pid()
    skipped = None
    for run in range(RUNS):
        truncate_inbox()
        store_batch(None, f"c{run}", count)
        vacuum()
        wall, cpu, busy = run_inbox_process(1)
        if pending_count() or completed_count() != count:
            raise RuntimeError("inbox_process did not complete every message")
        series["drain_command_small"].add(count, wall, cpu, None, busy)
        with measuring(series["drain_bare_small"], count, pid):
            run_ops(bare_op, count, start=run * count)
        with measuring(series["drain_bare_batched"], count, pid):
            run_ops(_batched_op, count // BATCHED, start=run * count)
        skipped = procrastinate_drain(series["drain_procrastinate"], count)
        rates = [f"{s.rates[-1]:6.0f}" if s.rates else "  skip" for s in series.values()]
        log(f"   run {run + 1}: command {rates[0]}, bare {rates[1]}, procrastinate {rates[2]} /s")
    if skipped:
        log(f"   procrastinate skipped: {skipped}")
        series["drain_procrastinate"].extra["skipped"] = skipped
    truncate_inbox()
    return series
