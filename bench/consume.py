#!/usr/bin/env python
"""Broker consumers the benchmark starts as subprocesses (with ``bench.settings``).

``plain``: the baseline of ``manage.py inbox_consume``, a plain kombu consumer without the
inbox. Each message: ``close_old_connections()`` (what any long-running Django consumer calls
between messages, as ``inbox_consume`` does), ``json.loads`` of the body, the benchmark
handler's body (``bench.inbox_handlers.take_one``: one single-row UPDATE) inside
``transaction.atomic()``, then the ack, after the commit. The same connection loop as
``inbox_consume``: ``drain_events(timeout=0.5)`` until no message came for ``--until-idle``
seconds, the same prefetch, the same transport options (``INBOX_BROKER_TRANSPORT_OPTIONS``).
It prints one JSON line: messages handled, and the wall-clock time (``time.time()``) at which
the first and the last message began, as the inbox's ``received_at`` marks it.

``inbox``: ``call_command("inbox_consume", …)`` in this process, only to profile it.

Both take ``--profile FILE`` (cProfile of the consuming part only, Django's start-up
excluded, written with ``pstats.dump_stats``) and ``--max-messages`` (stop after that many,
so a profile does not end with the ``--until-idle`` wait).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if sys.path and Path(sys.path[0] or ".").resolve() == BENCH_DIR:
    sys.path.pop(0)  # import bench.* as a package
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]


def plain(
    broker: str, queue_name: str, prefetch: int, until_idle: float, max_messages: int | None
) -> dict[str, Any]:
    """Consume ``queue_name`` without the inbox until it stays idle for ``until_idle`` s
    (or until ``max_messages`` were handled)."""
    from django.conf import settings
    from django.db import close_old_connections, transaction
    from kombu import Connection, Queue

    from bench.inbox_handlers import take_one

    state: dict[str, Any] = {"count": 0, "first": None, "last": None}
    last_message = time.monotonic()

    def on_message(message: Any) -> None:
        nonlocal last_message
        last_message = time.monotonic()
        began = time.time()
        if state["first"] is None:
            state["first"] = began
        state["last"] = began
        close_old_connections()
        payload = json.loads(message.body)
        with transaction.atomic():
            take_one(SimpleNamespace(payload=payload))
        message.ack()
        state["count"] += 1

    options = dict(getattr(settings, "INBOX_BROKER_TRANSPORT_OPTIONS", {}) or {})
    connection = Connection(broker, transport_options=options)
    try:
        connection.ensure_connection(max_retries=1)
        queue = Queue(queue_name, routing_key=queue_name, durable=True)
        with connection.Consumer([queue], on_message=on_message, prefetch_count=prefetch):
            while time.monotonic() - last_message < until_idle:
                if max_messages is not None and state["count"] >= max_messages:
                    break
                try:
                    connection.drain_events(timeout=0.5)
                except TimeoutError:
                    connection.heartbeat_check()
    finally:
        connection.release()
    close_old_connections()
    return state


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["plain", "inbox"])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--queue", required=True)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--until-idle", type=float, default=2.0)
    parser.add_argument("--ack", default="after-process")
    parser.add_argument("--max-messages", type=int, default=None)
    parser.add_argument("--profile", default=None, help="write a cProfile of the consuming part")
    args = parser.parse_args()

    import django

    django.setup()
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    if args.kind == "plain":
        result = plain(args.broker, args.queue, args.prefetch, args.until_idle, args.max_messages)
    else:
        from django.core.management import call_command

        call_command(
            "inbox_consume",
            consumer="bench",
            queue=args.queue,
            broker=args.broker,
            prefetch=args.prefetch,
            until_idle=args.until_idle,
            ack=args.ack,
            max_messages=args.max_messages,
            verbosity=0,
        )
        result = {}
    if profiler:
        profiler.disable()
        profiler.dump_stats(args.profile)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
