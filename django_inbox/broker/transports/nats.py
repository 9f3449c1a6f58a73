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
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.js import api

from .base import Received, Subscription, Transport, masked
from .nats_messages import NatsDelivery, durable_name

logger = logging.getLogger("django_inbox")
T = TypeVar("T")

#: Seconds a call into the client may take before the connection is taken for lost.
CALL_TIMEOUT = 30.0
#: The shortest wait of a fetch (JetStream's pull requests need a positive expiry).
MIN_FETCH = 0.05


class CallTimeout(Exception):
    """The client did not answer a call in time: the connection is taken for lost."""


class NatsRefused(Exception):
    """The server refused the credentials, the connection's terms (TLS) or what JetStream was
    asked (a consumer it cannot create, a durable consumer that does not fit)."""


#: The client's errors that mean the connection is gone (the loop connects again).
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    CallTimeout,
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
)


async def _ack_all(messages: list[Any]) -> None:
    """Acknowledge JetStream ``messages`` (each ack is a publish to the client's buffer)."""
    for message in messages:
        await message.ack()


class NatsTransport(Transport):
    schemes = ("nats",)

    def __init__(self, url: str, subscription: Subscription) -> None:
        super().__init__(url, subscription)
        self.connection_errors = CONNECTION_ERRORS
        self.refusals = (NatsRefused, nats.errors.AuthorizationError)
        self.durable = durable_name(subscription.consumer)
        self.stream: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._pull: Any = None
        self._js: Any = None
        #: The stream's retention policy (``limits``, ``interest``, ``workqueue``).
        self.retention = ""
        # Acks held and sent in one hop to the client's thread.
        self.ack_batch = max(subscription.prefetch, 1)

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
            if future.done():
                raise  # the work's own timeout (a fetch that found nothing)
            future.cancel()
            raise CallTimeout(f"the NATS client did not answer within {timeout:.0f}s") from None

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
        async def error(exc: Exception) -> None:
            consumer = self.subscription.consumer
            logger.warning("inbox_consume %s: NATS: %s: %s", consumer, type(exc).__name__, exc)

        try:
            self._client = await nats.connect(
                self.url,
                allow_reconnect=False,
                # Two quick tries per open (nats-py takes 0 for "for ever"): the consume loop
                # retries with its own backoff, and a stop is not held up by the client's.
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                connect_timeout=5,
                error_cb=error,
                name=f"inbox_consume {self.subscription.consumer}",
            )
        except CONNECTION_ERRORS:
            raise
        except nats.errors.Error as exc:  # credentials, TLS: no retry helps
            raise NatsRefused(f"the NATS server refused the connection: {exc}") from None
        try:
            await self._subscribe()
        except nats.js.errors.ServiceUnavailableError:
            raise
        except nats.js.errors.APIError as exc:
            raise NatsRefused(f"JetStream refused: {exc}") from None

    async def _subscribe(self) -> None:
        js = self._client.jetstream()
        subject = self.subscription.queue
        try:
            self.stream = await js.find_stream_name_by_subject(subject)
        except nats.js.errors.NotFoundError:
            raise NatsRefused(
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
                raise NatsRefused(
                    f"stream {self.stream!r} has no durable consumer {self.durable!r} and "
                    "--no-declare forbids creating it"
                ) from None
            await js.add_consumer(self.stream, wanted)
        else:
            self._check_existing(found.config, subject)
        info = await js.stream_info(self.stream)
        self.retention = str(getattr(info.config.retention, "value", info.config.retention))
        self._pull = await js.pull_subscribe_bind(self.durable, self.stream)
        self._js = js

    def _check_existing(self, config: Any, subject: str) -> None:
        filters = [config.filter_subject] if config.filter_subject else []
        filters += list(config.filter_subjects or [])
        if filters != [subject]:
            raise NatsRefused(
                f"durable consumer {self.durable!r} on stream {self.stream!r} filters "
                f"{filters or 'every subject'}, not {subject!r}: delete it or consume its subject"
            )
        if config.deliver_subject:
            raise NatsRefused(
                f"durable consumer {self.durable!r} is a push consumer: inbox_consume pulls"
            )
        policy = getattr(config.ack_policy, "value", config.ack_policy)
        if policy != "explicit":
            raise NatsRefused(
                f"durable consumer {self.durable!r} acknowledges {policy!r}: the inbox needs "
                "explicit acknowledgements (one per message, after its commit)"
            )
        if config.ack_wait is not None and abs(config.ack_wait - self.subscription.lease) > 1:
            logger.warning(
                "inbox_consume %s: durable consumer %s waits %ss for an acknowledgement, the "
                "inbox consumer's lease is %ss: a message is redelivered after the first",
                self.subscription.consumer,
                self.durable,
                config.ack_wait,
                self.subscription.lease,
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

    async def _refuse(self, delivery: NatsDelivery) -> None:
        """Copy a refused message to ``<its subject>.refused`` (kept by whichever stream holds
        that subject), then ``term`` it. With no stream holding it, a stream of ``limits``
        retention keeps the message after ``term``; on ``workqueue`` or ``interest`` streams,
        where ``term`` deletes it, it is ``nak``-ed for an hour instead and stays pending."""
        message = delivery._message
        sequence = delivery.delivery_info.get("stream_sequence")
        headers = {str(k): str(v) for k, v in (message.headers or {}).items()}
        headers["x-inbox-refused"] = delivery.refused_because[:1000]
        headers["x-inbox-stream"] = f"{self.stream}:{sequence}"
        target = f"{message.subject}.refused"
        try:
            await self._js.publish(target, message.data, headers=headers)
        except nats.js.errors.NoStreamResponseError:
            keep = self.retention == "limits"
            logger.error(
                "inbox_consume %s: refused message %s of stream %s (%s); no stream holds %s "
                "to keep a copy: %s",
                self.subscription.consumer,
                sequence,
                self.stream,
                delivery.refused_because,
                target,
                "it stays in the stream (limits retention)"
                if keep
                else f"it stays pending for an hour ({self.retention} retention would delete it)",
            )
            if not keep:
                await message.nak(delay=3600)
                return
        await message.term()

    def send_acks(self, items: list[Any]) -> None:
        self._call(_ack_all(items))

    def receive(self, timeout: float) -> list[Received]:
        wait = max(timeout, MIN_FETCH)
        try:
            messages = self._call(self._fetch(wait), timeout=wait + CALL_TIMEOUT)
        except (nats.errors.TimeoutError, TimeoutError):  # nothing came (CallTimeout is not)
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
        return masked(self.url)

    def describe(self) -> str:
        declared = "created if missing" if self.subscription.declare else "must exist"
        return (
            f"subject {self.subscription.queue!r} (JetStream durable consumer "
            f"{self.durable!r}, {declared})"
        )
