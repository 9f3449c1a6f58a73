"""NATS JetStream (``nats://HOST:PORT``): a durable pull consumer per inbox consumer.

``inbox_consume --broker nats://127.0.0.1:4222 --queue orders.created`` reads the JetStream
stream that holds the subject (it must exist: a stream's retention is a decision of its own)
through a durable pull consumer named after the inbox consumer, with explicit
acknowledgements:

- acknowledged after the inbox committed; refused messages are terminated (``term``: never
  redelivered, reported by JetStream's ``MSG_TERMINATED`` advisory and kept in the stream
  under its retention); requeued ones are ``nak``-ed and delivered again;
- the consumer's ``ack_wait`` is the inbox consumer's lease, and ``max_deliver`` is unlimited:
  the inbox counts deliveries (``num_delivered`` from JetStream's metadata) and ends a message
  that kills its consumer every time ``dead`` after its attempts, which a smaller
  ``max_deliver`` would cut short (the message would stop arriving before the inbox kept it);
- when ``declare`` is off, the durable consumer must exist; one that filters another subject is
  refused rather than read.

Several ``inbox_consume`` processes of one inbox consumer share its durable consumer: JetStream
hands each message to one of them at a time.

nats-py is asynchronous: its client runs on an event loop in a thread of its own, so that it
answers the server's pings while a handler runs; the consume loop calls it through
:meth:`NatsTransport._call`. The client does not reconnect on its own here: a lost connection
ends the transport, and the consume loop connects again with its backoff, as for every broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
from nats.js import api

from .base import Received, Subscription, Transport

logger = logging.getLogger("django_inbox")
T = TypeVar("T")

#: Seconds a call into the client may take before the connection is taken for lost.
CALL_TIMEOUT = 30.0
#: The shortest wait of a fetch (JetStream's pull requests need a positive expiry).
MIN_FETCH = 0.05
#: Characters a durable consumer's name may hold as they are; others are escaped.
_NAME_SAFE = re.compile(r"[A-Za-z0-9-]")

#: The client's errors that mean the connection is gone (the loop connects again).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.UnexpectedEOF,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
    nats.errors.NoRespondersError,  # JetStream not (yet) answering
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)


class StreamMissing(Exception):
    """No JetStream stream holds the subject, or the durable consumer does not fit it."""


def durable_name(consumer: str) -> str:
    """The JetStream durable consumer's name for an inbox consumer: letters, digits and ``-``
    as they are, every other character ``_`` and its UTF-8 bytes in hex (``billing.v2`` ->
    ``billing_2ev2``), so that two inbox consumers never share one."""
    return "".join(
        char if _NAME_SAFE.fullmatch(char) else "_" + char.encode("utf-8").hex()
        for char in consumer
    )


class NatsDelivery:
    """A JetStream message as the envelope reads it (see :class:`~.base.Delivery`)."""

    def __init__(self, transport: NatsTransport, message: Any) -> None:
        self._transport = transport
        self._message = message
        headers = dict(message.headers or {})
        self.headers: dict[str, Any] = headers
        self.body: bytes = message.data
        lowered = {str(name).lower(): value for name, value in headers.items()}
        self.content_type: str | None = lowered.get("content-type")
        self.content_encoding: str | None = None
        self.properties: dict[str, Any] = {}
        # JetStream's own deduplication id, when the publisher set one: the message id.
        if lowered.get("nats-msg-id"):
            self.properties["message_id"] = lowered["nats-msg-id"]
        try:
            metadata = message.metadata
            count = int(metadata.num_delivered or 1)
            sequence = metadata.sequence.stream if metadata.sequence else None
        except Exception:  # not a JetStream message: counted as a first delivery
            count, sequence = 1, None
        self.delivery_info: dict[str, Any] = {
            "redelivered": count > 1,
            "delivery_count": count,
            "subject": message.subject,
            "stream_sequence": sequence,
        }

    def ack(self) -> None:
        self._transport._call(self._message.ack())

    def reject(self, requeue: bool = False) -> None:
        if requeue:
            self.requeue()
        else:
            self._transport._call(self._message.term())

    def requeue(self) -> None:
        self._transport._call(self._message.nak())


class NatsTransport(Transport):
    schemes = ("nats",)

    def __init__(self, url: str, subscription: Subscription) -> None:
        super().__init__(url, subscription)
        self.connection_errors = CONNECTION_ERRORS
        self.refusals = (StreamMissing, nats.errors.AuthorizationError)
        self.durable = durable_name(subscription.consumer)
        self.stream: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._pull: Any = None

    # -- the client's thread ----------------------------------------------------------------

    def _call(self, work: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT) -> T:
        """Run ``work`` on the client's loop and wait for it."""
        if self._loop is None:
            work.close()
            raise nats.errors.ConnectionClosedError()
        future = asyncio.run_coroutine_threadsafe(work, self._loop)
        try:
            return future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._thread = threading.Thread(target=run, name="inbox-nats", daemon=True)
        self._thread.start()
        ready.wait()
        self._loop = loop

    # -- the interface ------------------------------------------------------------------

    def open(self) -> None:
        self._start_loop()
        self._call(self._open())

    async def _open(self) -> None:
        lost = asyncio.Event()

        async def closed() -> None:
            lost.set()

        async def error(exc: Exception) -> None:
            consumer = self.subscription.consumer
            logger.warning("inbox_consume %s: NATS: %s: %s", consumer, type(exc).__name__, exc)

        self._client = await nats.connect(
            self.url,
            allow_reconnect=False,
            connect_timeout=5,
            closed_cb=closed,
            error_cb=error,
            name=f"inbox_consume {self.subscription.consumer}",
        )
        js = self._client.jetstream()
        subject = self.subscription.queue
        try:
            self.stream = await js.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            raise StreamMissing(
                f"no JetStream stream holds subject {subject!r}: create one (for example "
                f"`nats stream add ORDERS --subjects {subject!r}`), then consume it"
            ) from None
        wanted = api.ConsumerConfig(
            durable_name=self.durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.subscription.lease,
            max_deliver=-1,
            filter_subject=subject,
            max_ack_pending=max(self.subscription.prefetch * 10, 1000),
        )
        try:
            found = await js.consumer_info(self.stream, self.durable)
        except nats.js.errors.NotFoundError:
            if not self.subscription.declare:
                raise StreamMissing(
                    f"stream {self.stream!r} has no durable consumer {self.durable!r} and "
                    "--no-declare forbids creating it"
                ) from None
            await js.add_consumer(self.stream, wanted)
        else:
            self._check_existing(found.config, subject)
        self._pull = await js.pull_subscribe_bind(self.durable, self.stream)

    def _check_existing(self, config: Any, subject: str) -> None:
        filters = [config.filter_subject] if config.filter_subject else []
        filters += list(config.filter_subjects or [])
        if filters != [subject]:
            raise StreamMissing(
                f"durable consumer {self.durable!r} on stream {self.stream!r} filters "
                f"{filters or 'every subject'}, not {subject!r}: delete it or consume its subject"
            )
        attempts = config.max_deliver
        if attempts is not None and attempts > 0:
            logger.warning(
                "inbox_consume %s: durable consumer %s has max_deliver %s: a message that "
                "keeps failing before the inbox keeps it stops arriving after that many "
                "deliveries; -1 (unlimited) lets the inbox end it dead after its attempts",
                self.subscription.consumer,
                self.durable,
                attempts,
            )

    def receive(self, timeout: float) -> list[Received]:
        wait = max(timeout, MIN_FETCH)
        try:
            messages = self._call(self._fetch(wait), timeout=wait + CALL_TIMEOUT)
        except nats.errors.TimeoutError:
            return []
        return [Received(NatsDelivery(self, message)) for message in messages]

    async def _fetch(self, wait: float) -> list[Any]:
        if self._client is None or self._client.is_closed:
            raise nats.errors.ConnectionClosedError()
        messages: list[Any] = await self._pull.fetch(batch=self.subscription.prefetch, timeout=wait)
        return messages

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        client = self._client

        async def finish() -> None:
            if client is not None and not client.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.flush(), 2)  # the acks sent so far
                await client.close()

        with contextlib.suppress(Exception):  # the connection is gone already
            asyncio.run_coroutine_threadsafe(finish(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        if not loop.is_running():
            loop.close()

    def masked_url(self) -> str:
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        return urlunsplit(parts._replace(netloc=f"{parts.username}:**@{host}"))

    def describe(self) -> str:
        declared = "created if missing" if self.subscription.declare else "must exist"
        return (
            f"subject {self.subscription.queue!r} (JetStream durable consumer "
            f"{self.durable!r}, {declared})"
        )
