"""NATS JetStream for the tests: streams on the machine's server (127.0.0.1:4222), publishing,
reading a durable consumer's state, and a server of a test's own (:func:`private_nats`) for the
tests that restart it."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Coroutine, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import nats
from nats.js import api

NATS = os.environ.get("INBOX_TEST_NATS", "nats://127.0.0.1:4222")
T = TypeVar("T")


def run(work: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(work)


@dataclass
class Stream:
    """A JetStream stream of a test's own and the subject it is consumed on."""

    url: str
    name: str
    subject: str


def new_stream(url: str = NATS) -> Stream:
    """A new stream (file storage) holding ``<name>.>``; consumed on ``<name>.events``."""
    name = f"INBOX_TEST_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        client = await nats.connect(url)
        try:
            await client.jetstream().add_stream(
                name=name, subjects=[f"{name}.>"], storage=api.StorageType.FILE
            )
        finally:
            await client.close()

    run(create())
    return Stream(url, name, f"{name}.events")


def delete_stream(stream: Stream) -> None:
    async def delete() -> None:
        client = await nats.connect(stream.url)
        try:
            await client.jetstream().delete_stream(stream.name)
        except Exception:
            pass
        finally:
            await client.close()

    run(delete())


def publish(stream: Stream, messages: Iterable[dict[str, Any]], subject: str = "") -> int:
    """Publish each message (``{"id", "type", "body", "headers"}``) with its id in a
    ``message_id`` header, never ``Nats-Msg-Id``: JetStream would drop the duplicates itself,
    and the test is that the inbox does."""

    async def send() -> int:
        client = await nats.connect(stream.url)
        js = client.jetstream()
        count = 0
        try:
            for message in messages:
                body = message.get("body")
                if not isinstance(body, (bytes, str)):
                    body = json.dumps(body)
                if isinstance(body, str):
                    body = body.encode("utf-8")
                headers = dict(message.get("headers") or {})
                if message.get("id") is not None:
                    headers["message_id"] = message["id"]
                if message.get("type") is not None:
                    headers["event_type"] = message["type"]
                await js.publish(subject or stream.subject, body, headers=headers or None)
                count += 1
        finally:
            await client.close()
        return count

    return run(send())


def publish_raw(stream: Stream, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    """Publish one message over NATS's own protocol (``HPUB``), with header bytes as given:
    what another language's client can send and nats-py cannot (values that are not UTF-8)."""
    parts = urlsplit(stream.url)
    head = b"NATS/1.0\r\n" + b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    head += b"\r\n"
    with socket.create_connection((parts.hostname, parts.port or 4222), timeout=10) as sock:
        reader = sock.makefile("rb")
        reader.readline()  # INFO
        sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n')
        inbox = b"_INBOX.raw"
        sock.sendall(b"SUB " + inbox + b" 1\r\n")
        sock.sendall(
            b"HPUB %s %s %d %d\r\n"
            % (stream.subject.encode(), inbox, len(head), len(head) + len(body))
            + head
            + body
            + b"\r\n"
        )
        sock.sendall(b"PING\r\n")
        while True:  # JetStream's acknowledgement comes to the inbox subject
            line = reader.readline()
            if line.startswith((b"HMSG", b"MSG")):
                reader.readline()
                break
            if line.startswith(b"-ERR") or not line:
                raise RuntimeError(f"publishing failed: {line!r}")


def refused_copies(stream: Stream) -> list[dict[str, str]]:
    """The headers of the copies kept on ``<subject>.refused`` (in the same stream)."""

    async def read() -> list[dict[str, str]]:
        client = await nats.connect(stream.url)
        js = client.jetstream()
        found: list[dict[str, str]] = []
        try:
            info = await js.stream_info(stream.name, subjects_filter=f"{stream.subject}.refused")
            if not (info.state.subjects or {}).get(f"{stream.subject}.refused"):
                return []
            last = await js.get_last_msg(stream.name, f"{stream.subject}.refused")
            found.append(dict(last.headers or {}))
        finally:
            await client.close()
        return found

    return run(read())


def consumer_state(stream: Stream, durable: str) -> dict[str, int]:
    """What the durable consumer still owes: ``pending`` (never delivered) and
    ``ack_pending`` (delivered, not acknowledged)."""

    async def look() -> dict[str, int]:
        client = await nats.connect(stream.url)
        try:
            info = await client.jetstream().consumer_info(stream.name, durable)
        finally:
            await client.close()
        return {"pending": info.num_pending, "ack_pending": info.num_ack_pending}

    return run(look())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class NatsServer:
    """A nats-server of a test's own, with JetStream storing in a directory of its own."""

    port: int
    store: Path
    process: subprocess.Popen[bytes] | None = None
    #: ``(user, password)`` the server requires, if any.
    credentials: tuple[str, str] | None = None

    @property
    def url(self) -> str:
        if self.credentials:
            user, password = self.credentials
            return f"nats://{user}:{password}@127.0.0.1:{self.port}"
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        auth = (
            ["--user", self.credentials[0], "--pass", self.credentials[1]]
            if self.credentials
            else []
        )
        where = ["-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store)]
        self.process = subprocess.Popen(
            [binary, *where, *auth],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"nats-server did not start on port {self.port}") from None
                time.sleep(0.1)
        # JetStream answers a little after the port opens.
        while not self._jetstream_ready():
            if time.monotonic() > deadline:
                raise RuntimeError("JetStream did not come up")
            time.sleep(0.2)

    def _jetstream_ready(self) -> bool:
        async def ask() -> bool:
            client = await nats.connect(self.url)
            try:
                await client.jetstream().account_info()
                return True
            except Exception:
                return False
            finally:
                await client.close()

        try:
            return run(ask())
        except Exception:
            return False

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, JetStream recovers from its files on the next start."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@contextmanager
def private_nats(credentials: tuple[str, str] | None = None) -> Iterator[NatsServer]:
    store = Path(tempfile.mkdtemp(prefix="inbox-nats-"))
    server = NatsServer(free_port(), store, credentials=credentials)
    server.start()
    try:
        yield server
    finally:
        server.kill()
        shutil.rmtree(store, ignore_errors=True)
