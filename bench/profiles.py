"""cProfile of ``deliver()`` and the drain, untimed."""

from __future__ import annotations

import cProfile
import pstats
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.config import PROFILE_N, ROOT, log, truncate_inbox, vacuum
from bench.deliver import bare_op, deliver_op
from bench.drain import store_batch
from bench.timing import run_ops

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
    from django_inbox.processing.worker import Worker

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
