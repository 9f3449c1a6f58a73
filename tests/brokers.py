"""Publishing test streams to the real brokers on 127.0.0.1."""

from __future__ import annotations

import json
import os
import random
import uuid
from collections.abc import Iterable
from typing import Any

from kombu import Connection, Queue

RABBITMQ = os.environ.get("INBOX_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
REDIS = os.environ.get("INBOX_TEST_REDIS", "redis://127.0.0.1:6379/3")
BROKERS = {"rabbitmq": RABBITMQ, "redis": REDIS}
#: Messages in the default run of the broker stream tests.
STREAM_N = int(os.environ.get("INBOX_TEST_BROKER_N", "2000"))
#: Redis hands an unacknowledged message back after this long (a killed consumer's).
REDIS_OPTIONS = {"visibility_timeout": 5, "unacked_restore_throttle": 1}


def options_for(url: str) -> dict[str, Any]:
    return dict(REDIS_OPTIONS) if url.startswith("redis") else {}


def new_queue_name(prefix: str = "inbox-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def connect(url: str) -> Connection:
    return Connection(url, transport_options=options_for(url))


def publish(url: str, queue: str, messages: Iterable[dict[str, Any]], **queue_args: Any) -> int:
    """Publish each message: ``{"id", "type", "body", "content_type", "headers"}``."""
    count = 0
    with connect(url) as connection:
        target = Queue(queue, routing_key=queue, durable=True, queue_arguments=queue_args or None)
        producer = connection.Producer()
        target(connection.default_channel).declare()
        for message in messages:
            body = message.get("body")
            if not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            properties: dict[str, Any] = {}
            if message.get("id") is not None:
                properties["message_id"] = message["id"]
            if message.get("type") is not None:
                properties["type"] = message["type"]
            producer.publish(
                body,
                routing_key=queue,
                content_type=message.get("content_type", "application/json"),
                content_encoding=message.get("content_encoding", "utf-8"),
                headers=message.get("headers") or {},
                delivery_mode=2,
                retry=True,
                **properties,
            )
            count += 1
    return count


def stream(n: int, *, seed: int = 1, **payload: Any) -> tuple[list[dict[str, Any]], set[str]]:
    """``n`` unique messages, about 30% of them published 1 to 4 extra times, shuffled."""
    rng = random.Random(seed)
    unique = [
        {"id": f"m-{k:06d}", "type": "effect.write", "body": dict(payload, n=k)} for k in range(n)
    ]
    messages = list(unique)
    for message in unique:
        if rng.random() < 0.3:
            messages.extend([message] * rng.randint(1, 4))
    rng.shuffle(messages)
    return messages, {m["id"] for m in unique}


def queue_depth(url: str, queue: str) -> int:
    with connect(url) as connection:
        bound = Queue(queue, durable=True)(connection.default_channel)
        try:
            return int(bound.queue_declare(passive=True).message_count)
        except connection.channel_errors:
            if url.startswith("redis"):
                return 0  # Redis keeps no empty list: a queue drained to nothing is gone
            raise


def delete_queue(url: str, queue: str) -> None:
    try:
        with connect(url) as connection:
            Queue(queue)(connection.default_channel).delete()
    except Exception:
        pass
