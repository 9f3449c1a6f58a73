"""Reading profiles: py-spy samples and cProfile statistics turned into per-message costs."""

from __future__ import annotations

import pstats
import re
from collections import Counter
from typing import Any

from bench.config import ROOT
from bench.profiles import _where

ROOTS = {
    # per-message callback, the consuming loop, the loop's file
    "inbox": ("_on_message", "run", "django_inbox/broker/connection.py"),
    "plain": ("on_message", "plain", "bench/consume.py"),
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
    per_message, loop, loop_file = ROOTS[kind]
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
            name == loop and loop_file in file
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
        return {"messages": count, "samples": 0, "wall_us_per_msg": round(wall_us, 1), "steps": {}}
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
    ("keep_connection", "keep_connection", "django_inbox/db/connection.py"),
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
    ("_on_message", "django_inbox/broker/connection.py"),
    ("take", "django_inbox/broker/acking.py"),
    ("on_message", "bench/consume.py"),
    ("parse", "django_inbox/broker/envelope.py"),
    ("deliver", "django_inbox/intake/delivery.py"),
    ("prepare", "django_inbox/intake/rows.py"),
    ("insert", "django_inbox/db/statements/hot.py"),
    ("materialise", "django_inbox/intake/rows.py"),
    ("take_one", "bench/inbox_handlers.py"),
    ("commit", "django/db/backends/base/base.py"),
    ("ack", "kombu/message.py"),
    ("keep_connection", "django_inbox/db/connection.py"),
    ("_between_messages", "django_inbox/broker/connection.py"),
    ("run_once", "django_inbox/processing/worker.py"),
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


#: The steps of one consumed message that the py-spy breakdown names: (function, file, what).
STEPS: list[tuple[str, str, str]] = [
    ("keep_connection", "django_inbox/db/connection.py", "keep_connection()"),
    ("parse", "broker/envelope.py", "envelope: read properties, decode body and headers"),
    ("loads", "json/", "json.loads of the body"),
    ("prepare", "django_inbox/intake/rows.py", "deliver: prepare (validate, JSON-encode)"),
    ("get", "django_inbox/registry.py", "deliver: registry lookup"),
    ("insert_or_status", "django_inbox/db/statements/hot.py", "deliver: inbox INSERT (insert)"),
    ("insert", "django_inbox/db/statements/hot.py", "deliver: inbox INSERT (insert)"),
    ("materialise", "django_inbox/intake/rows.py", "deliver: build InboxMessage (materialise)"),
    ("take_one", "bench/inbox_handlers.py", "handler: ORM UPDATE (take_one)"),
    ("__enter__", "django/db/transaction.py", "atomic() enter (BEGIN is sent with the 1st query)"),
    ("__exit__", "django/db/transaction.py", "atomic() exit: COMMIT"),
    ("now", "django/utils/timezone.py", "timezone.now()"),
    ("ack", "kombu/message.py", "message.ack()"),
]
