"""Redis Streams for the tests: streams on the machine's Redis, entries written as producers
write them, a consumer group's debts, and a Redis of a test's own with persistence on
(:func:`private_redis`) for the tests that kill it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

REDIS = os.environ.get("INBOX_TEST_REDIS_STREAMS", "redis://127.0.0.1:6379/4")


@dataclass
class Stream:
    """A stream of a test's own, on the Redis at ``url`` (``redis://``)."""

    url: str
    name: str

    @property
    def broker(self) -> str:
        return self.url.replace("redis://", "redis+streams://", 1)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


def new_stream(url: str = REDIS) -> Stream:
    return Stream(url, f"inbox-test-{uuid.uuid4().hex[:10]}")


def delete_stream(stream: Stream) -> None:
    with suppress(redis.exceptions.ConnectionError):
        stream.client().delete(stream.name, f"{stream.name}:dead")


def publish(stream: Stream, messages: Iterable[dict[str, Any]]) -> int:
    """``XADD`` each message (``{"id", "type", "body", "headers"}``) as the fields
    ``message_id``, ``event_type``, ``payload`` (JSON text) and ``headers`` (JSON text);
    ``fields`` replaces them all when given."""
    client = stream.client()
    count = 0
    with client.pipeline(transaction=False) as pipe:
        for message in messages:
            fields = message.get("fields")
            if fields is None:
                body = message.get("body")
                if not isinstance(body, (bytes, str)):
                    body = json.dumps(body)
                fields = {"payload": body}
                if message.get("id") is not None:
                    fields["message_id"] = message["id"]
                if message.get("type") is not None:
                    fields["event_type"] = message["type"]
                if message.get("headers") is not None:
                    fields["headers"] = json.dumps(message["headers"])
            pipe.xadd(stream.name, fields)
            count += 1
            if count % 500 == 0:
                pipe.execute()
        pipe.execute()
    return count


def owed(stream: Stream, group: str) -> dict[str, int]:
    """What the group still owes: entries never read (``lag``) and read but not acknowledged
    (``pending``)."""
    client = stream.client()
    for found in client.xinfo_groups(stream.name):
        if found["name"].decode() == group:
            # Redis answers no lag when it cannot tell (after deletions): never taken for 0.
            assert found.get("lag") is not None, f"Redis cannot tell the lag of {group!r}"
            return {"lag": int(found["lag"]), "pending": int(found["pending"])}
    raise AssertionError(f"no group {group!r} on {stream.name}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RedisServer:
    """A redis-server of a test's own, writing every command to its append-only file."""

    port: int
    home: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30) -> None:
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.home),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "",
                "--daemonize", "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=1).ping():
                    return
            except (redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: it comes back from its append-only file on the next start."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@contextmanager
def private_redis() -> Iterator[RedisServer]:
    home = Path(tempfile.mkdtemp(prefix="inbox-redis-"))
    server = RedisServer(free_port(), home)
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(home, ignore_errors=True)
