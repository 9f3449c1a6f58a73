"""Redis Streams (``redis+streams://HOST:PORT/DB``, ``rediss+streams://`` over TLS).

``inbox_consume --broker redis+streams://127.0.0.1:6379/0 --queue orders`` reads the stream
``orders`` through a consumer group named after the inbox consumer, created from the stream's
start (``0``, ``MKSTREAM``) when absent. Each process is a consumer of the group under a name of
its own (host, pid and a random suffix).

- An entry's fields: ``message_id``, ``event_type``, ``payload`` (JSON text), optional
  ``headers`` (a JSON object as text: ordering keys, CloudEvents attributes, trace context).
- ``XACK`` after the inbox committed. Unlike kombu's Redis lists, an entry read with
  ``XREADGROUP`` stays in the group's pending list until acknowledged: a consumer killed at any
  point leaves it there, never lost.
- Entries a consumer left pending longer than the lease (dead, or stuck) are claimed with
  ``XAUTOCLAIM`` by whichever consumer looks next, and counted as redeliveries (a message that
  kills its consumer every time ends ``dead`` after its attempts).
- Refused entries (no id, an unusable one) are copied to the stream ``<stream>:dead`` with
  the reason, then acknowledged once the copy is kept: never dropped. Entries given back (a
  stop, a database error) are made claimable at once (``XCLAIM … IDLE <lease>``) rather than
  after the lease. Needs Redis 7.0 or later (``XAUTOCLAIM``'s reply of deleted entries).
- At a graceful stop the process's consumer leaves the group if it holds nothing (what it gave
  back stays in its name until another claims it); consumers idle for a day with nothing
  pending are removed when a process starts. A consumer is never removed while it holds
  entries: Redis would drop them from the pending list.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from typing import Any

import redis
import redis.exceptions

from .base import Received, Subscription, Transport, masked

logger = logging.getLogger("django_inbox")

#: Consumers of the group with nothing pending and idle this long are removed at start.
STALE_CONSUMER_MS = 24 * 3600 * 1000
#: Seconds between looks for entries other consumers left pending past the lease.
CLAIM_EVERY = 5.0


class GroupMissing(Exception):
    """The stream or its consumer group is missing and ``--no-declare`` forbids creating it,
    or the key holds no stream."""


class StreamDelivery:
    """A stream entry as the envelope reads it (see :class:`~.base.Delivery`)."""

    def __init__(
        self, transport: RedisStreamsTransport, entry_id: bytes, fields: dict[bytes, bytes]
    ) -> None:
        self._transport = transport
        self.entry_id = entry_id
        self.fields = fields
        self.body: bytes = fields.get(b"payload", b"")
        self.content_type: str | None = "application/json"
        self.content_encoding: str | None = "utf-8"
        self.properties: dict[str, Any] = {}
        for name, field in (("message_id", b"message_id"), ("type", b"event_type")):
            if field in fields:
                self.properties[name] = fields[field]
        self.headers: dict[str, Any] = {}
        self.delivery_info: dict[str, Any] = {"entry_id": entry_id.decode(), "redelivered": False}
        self.refused_because = "refused by inbox_consume"

    def read_headers(self) -> BaseException | None:
        """Read the ``headers`` field; the reason it cannot be read, or ``None``."""
        raw = self.fields.get(b"headers")
        if raw is None:
            return None
        try:
            found = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            return ValueError(f"the entry's headers field is not JSON: {exc}")
        if not isinstance(found, dict):
            return ValueError("the entry's headers field is not a JSON object")
        self.headers = found
        return None

    def ack(self) -> None:
        self._transport.hold_ack(self.entry_id)

    def reject(self, requeue: bool = False) -> None:
        if requeue:
            self.requeue()
            return
        transport = self._transport
        dead = {
            **self.fields,
            b"x-inbox-refused": self.refused_because.encode("utf-8", "backslashreplace"),
            b"x-inbox-entry-id": self.entry_id,
        }
        # The copy first, then the XACK only if it was kept (a MULTI would XACK even when the
        # XADD fails, say on a key of another type); a copy kept twice is harmless.
        transport.client.xadd(transport.dead_stream, dead)
        transport.client.xack(transport.stream, transport.group, self.entry_id)

    def requeue(self) -> None:
        transport = self._transport
        # Idle as long as the lease: the next XAUTOCLAIM of any consumer takes it at once.
        transport.client.xclaim(
            transport.stream,
            transport.group,
            transport.name,
            0,
            [self.entry_id],
            idle=transport.lease_ms,
            justid=True,
        )


class RedisStreamsTransport(Transport):
    schemes = ("redis+streams", "rediss+streams")

    def __init__(self, url: str, subscription: Subscription) -> None:
        super().__init__(url, subscription)
        self.connection_errors = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            redis.exceptions.BusyLoadingError,
            OSError,
        )
        self.refusals = (GroupMissing, redis.exceptions.AuthenticationError)
        self.redis_url = url.replace("+streams://", "://", 1)
        self.stream = subscription.queue
        self.dead_stream = f"{self.stream}:dead"
        self.group = subscription.consumer
        self.name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.lease_ms = max(int(subscription.lease * 1000), 1)
        self.client: Any = None
        self.ack_batch = max(subscription.prefetch, 1)  # one XACK for a batch's entries
        self._claimed_at = 0.0
        self._claim_from = "0-0"

    def open(self) -> None:
        # A socket timeout above the longest XREADGROUP block: a half-open connection (a
        # failover, a NAT's lost state) ends in a timeout and a reconnect, never a hang.
        self.client = redis.Redis.from_url(
            self.redis_url,
            socket_connect_timeout=5,
            socket_timeout=30,
            socket_keepalive=True,
            health_check_interval=30,
        )
        version = str(self.client.info("server").get("redis_version", "0"))
        if tuple(int(part) for part in version.split(".")[:2] if part.isdigit()) < (7, 0):
            raise GroupMissing(
                f"Redis {version} has no XAUTOCLAIM reply with deleted entries: Redis Streams "
                "need Redis 7.0 or later"
            )
        try:
            self.client.xinfo_groups(self.stream)
        except redis.exceptions.ResponseError as exc:
            if "no such key" not in str(exc).lower():
                raise GroupMissing(f"key {self.stream!r} holds no stream: {exc}") from None
        self._ensure_group()
        self._forget_stale_consumers()

    def _ensure_group(self) -> None:
        groups = {g["name"].decode(): g for g in self._groups()}
        if self.group in groups:
            return
        if not self.subscription.declare:
            raise GroupMissing(
                f"stream {self.stream!r} has no consumer group {self.group!r} and --no-declare "
                "forbids creating it"
            )
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):  # another process created it meanwhile
                raise

    def _groups(self) -> list[dict[str, Any]]:
        try:
            return list(self.client.xinfo_groups(self.stream))
        except redis.exceptions.ResponseError:
            return []  # no stream yet

    def _forget_stale_consumers(self) -> None:
        try:
            consumers = self.client.xinfo_consumers(self.stream, self.group)
        except redis.exceptions.ResponseError:
            return
        for consumer in consumers:
            if consumer["pending"] == 0 and consumer["idle"] > STALE_CONSUMER_MS:
                self.client.xgroup_delconsumer(self.stream, self.group, consumer["name"])

    def send_acks(self, items: list[Any]) -> None:
        self.client.xack(self.stream, self.group, *items)

    def receive(self, timeout: float) -> list[Received]:
        now = time.monotonic()
        if now - self._claimed_at >= min(CLAIM_EVERY, self.subscription.lease / 2):
            claimed = self._claim()
            if claimed:
                return claimed
            self._claimed_at = now
        block = None if timeout <= 0 else max(int(timeout * 1000), 1)
        found = self.client.xreadgroup(
            self.group, self.name, {self.stream: ">"}, count=self.subscription.prefetch, block=block
        )
        received: list[Received] = []
        for _, entries in found or []:
            received += [self._received(entry_id, fields) for entry_id, fields in entries]
        return received

    def _claim(self) -> list[Received]:
        """Entries pending longer than the lease in any consumer of the group: this one's now,
        counted as redeliveries. Walks the pending list from where the last look stopped."""
        next_id, entries, deleted = self.client.xautoclaim(
            self.stream,
            self.group,
            self.name,
            min_idle_time=self.lease_ms,
            start_id=self._claim_from,
            count=self.subscription.prefetch,
        )[:3]
        self._claim_from = next_id.decode() if isinstance(next_id, bytes) else str(next_id)
        if deleted:
            # Trimmed from the stream (MAXLEN, XDEL) while pending: nothing left to read.
            logger.error(
                "inbox_consume %s: %d pending entries of stream %s were deleted from the "
                "stream before they were acknowledged (trimmed?); they cannot be read: %s",
                self.group,
                len(deleted),
                self.stream,
                ", ".join(i.decode() if isinstance(i, bytes) else str(i) for i in deleted[:50]),
            )
            self.client.xack(self.stream, self.group, *deleted)
        received = []
        for entry_id, fields in entries:
            if fields is None:  # deleted between the claim's look and its read
                self.client.xack(self.stream, self.group, entry_id)
                continue
            found = self._received(entry_id, fields)
            found.message.delivery_info["redelivered"] = True
            received.append(found)
        return received

    def _received(self, entry_id: bytes, fields: dict[bytes, bytes]) -> Received:
        delivery = StreamDelivery(self, entry_id, fields)
        return Received(delivery, delivery.read_headers())

    def close(self) -> None:
        client, self.client = self.client, None
        if client is None:
            return
        try:
            mine = [
                c
                for c in client.xinfo_consumers(self.stream, self.group)
                if c["name"].decode() == self.name
            ]
            if mine and mine[0]["pending"] == 0:
                client.xgroup_delconsumer(self.stream, self.group, self.name)
        except Exception:  # the connection is gone: the entry stays, removed when stale
            pass
        with contextlib.suppress(Exception):
            client.close()

    def masked_url(self) -> str:
        return masked(self.url)

    def describe(self) -> str:
        declared = "group created if missing" if self.subscription.declare else "group must exist"
        return f"stream {self.stream!r} (consumer group {self.group!r}, {declared})"
