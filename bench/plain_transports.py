#!/usr/bin/env python
"""Plain consumers of figure 12 (``bench/transports.py``), one per client, without the inbox.

``python bench/plain_transports.py KIND URL QUEUE PREFETCH UNTIL_IDLE [floor]`` with KIND ``amqp``
(kombu, ``drain_events`` then ``ack``, as ``bench/consume.py``), ``nats``
(nats-py, a durable pull consumer, fetch then ack), ``redis-streams`` (redis-py,
``XREADGROUP`` then ``XACK``) or ``sqs`` (boto3, ``ReceiveMessage`` then ``DeleteMessage``).
Each message: ``close_old_connections()``, ``json.loads`` of the body, the benchmark handler's
body (one single-row UPDATE) in ``transaction.atomic()``, then the acknowledgement, after the
commit: what ``inbox_consume`` does, without the inbox. With ``floor``, each transaction also
sends the inbox's own insert (the same statement, prepared, on the same connection, with no
Python of the inbox around it): what the inbox's one statement per message costs with this
client, whatever its Python, the floor figure 12 sets beside ``inbox_consume`` (which can
still pass it where it batches acknowledgements and the floor does not). It prints one JSON line:
messages handled and the wall-clock time at which the first and the last began.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
if sys.path and Path(sys.path[0] or ".").resolve() == BENCH_DIR:
    sys.path.pop(0)
sys.path[:0] = [str(ROOT), str(ROOT / "testproject")]


def main() -> None:
    import django

    django.setup()
    import datetime as dt
    import os

    from django.db import close_old_connections, connection, transaction

    from bench.deliver import RawPsycopg
    from bench.inbox_handlers import take_one

    kind, url, queue = sys.argv[1], sys.argv[2], sys.argv[3]
    prefetch, until_idle = int(sys.argv[4]), float(sys.argv[5])
    floor = sys.argv[6:] == ["floor"]
    state: dict[str, Any] = {"count": 0, "first": None, "last": None}

    def insert_row(body: str) -> None:
        """The inbox's insert, sent raw on Django's connection, prepared."""
        connection.ensure_connection()
        raw = connection.connection
        if raw.prepare_threshold is None:  # Django's default: explicit prepare=True then works
            raw.prepare_threshold = 2**31
        now = dt.datetime.now(dt.UTC)
        message_id = f"floor-{os.getpid()}-{state['count']}"
        cursor = raw.cursor()
        params = ("bench-raw", message_id, "bench.take", body, now, now, now)
        cursor.execute(RawPsycopg.INSERT, params, prepare=True)
        if cursor.fetchone() is None:
            raise RuntimeError("the floor's insert found a duplicate")

    def handle(body: bytes | str) -> None:
        began = time.time()
        if state["first"] is None:
            state["first"] = began
        state["last"] = began
        close_old_connections()
        payload = json.loads(body)
        with transaction.atomic():
            if floor:
                insert_row(body if isinstance(body, str) else body.decode())
            take_one(SimpleNamespace(payload=payload))
        state["count"] += 1

    last = time.monotonic()
    if kind == "nats":
        import nats
        import nats.errors

        loop = asyncio.new_event_loop()
        client = loop.run_until_complete(nats.connect(url))
        js = client.jetstream()
        stream = loop.run_until_complete(js.find_stream_name_by_subject(queue))
        pull = loop.run_until_complete(
            js.pull_subscribe(queue, durable="bench-plain", stream=stream)
        )
        while time.monotonic() - last < until_idle:
            try:
                messages = loop.run_until_complete(pull.fetch(batch=prefetch, timeout=0.5))
            except nats.errors.TimeoutError:
                continue
            for message in messages:
                handle(message.data)
                loop.run_until_complete(message.ack())
                last = time.monotonic()
        loop.run_until_complete(client.flush())
        loop.run_until_complete(client.close())
    elif kind == "amqp":
        from kombu import Connection, Queue

        def on_message(message: Any) -> None:
            nonlocal last
            handle(message.body)
            message.ack()
            last = time.monotonic()

        with Connection(url) as broker:
            bound = Queue(queue, routing_key=queue, durable=True)
            with broker.Consumer([bound], on_message=on_message, prefetch_count=prefetch):
                while time.monotonic() - last < until_idle:
                    try:
                        broker.drain_events(timeout=0.5)
                    except TimeoutError:
                        broker.heartbeat_check()
    elif kind == "redis-streams":
        import redis

        client = redis.Redis.from_url(url.replace("+streams://", "://", 1))
        with contextlib.suppress(redis.exceptions.ResponseError):
            client.xgroup_create(queue, "bench-plain", id="0", mkstream=True)
        while time.monotonic() - last < until_idle:
            found = client.xreadgroup(
                "bench-plain", "plain", {queue: ">"}, count=prefetch, block=500
            )
            for _, entries in found or []:
                for entry_id, fields in entries:
                    handle(fields[b"payload"])
                    client.xack(queue, "bench-plain", entry_id)
                    last = time.monotonic()
    elif kind == "sqs":
        from bench.transports import sqs_client

        sqs = sqs_client(url)
        queue_url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
        while time.monotonic() - last < until_idle:
            found = sqs.receive_message(
                QueueUrl=queue_url, MaxNumberOfMessages=min(prefetch, 10), WaitTimeSeconds=1,
                MessageAttributeNames=["All"],
            )  # fmt: skip
            for message in found.get("Messages") or []:
                handle(message["Body"])
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
                last = time.monotonic()
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    print(json.dumps(state))


if __name__ == "__main__":
    main()
