"""kombu's transports: RabbitMQ (``amqp://``), Redis lists (``redis://``), SQS through kombu
(``sqs://``), ``filesystem://`` and ``memory://``.

kombu hands messages to callbacks from inside ``drain_events``; :meth:`KombuTransport.receive`
collects what one call delivered. Options (:attr:`Subscription.options`): ``exchange``,
``exchange_type``, ``routing_key`` (bind the queue to an exchange when declaring) and
``transport_options`` (kombu's, e.g. Redis's visibility timeout).
"""

from __future__ import annotations

import contextlib
from typing import Any

from amqp.exceptions import AccessRefused, NotAllowed, NotFound, PreconditionFailed
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.messaging import Consumer

from ...conf import inbox_settings
from .base import Received, Subscription, Transport

#: The broker refused what we asked for: retrying cannot help, the configuration must change.
REFUSALS = (AccessRefused, NotAllowed, NotFound, PreconditionFailed)


AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")


def _heartbeat(url: str) -> dict[str, int]:
    """AMQP heartbeats (``INBOX_BROKER_HEARTBEAT``, whole seconds; off by default) unless the
    URL sets its own: without them, RabbitMQ keeps a cut-off or frozen consumer's
    unacknowledged messages for as long as its TCP connection looks open, which for an idle
    one can be forever."""
    seconds = int(inbox_settings.broker_heartbeat)
    scheme = url.split("://", 1)[0]
    if not seconds or scheme not in AMQP_SCHEMES or "heartbeat=" in url:
        return {}
    return {"heartbeat": seconds}


class KombuTransport(Transport):
    schemes = ("amqp", "amqps", "pyamqp", "redis", "rediss", "sqs", "filesystem", "memory")

    def __init__(self, url: str, subscription: Subscription) -> None:
        super().__init__(url, subscription)
        options = subscription.options
        self.exchange: str | None = options.get("exchange")
        self.exchange_type: str = options.get("exchange_type") or "direct"
        self.routing_key: str | None = options.get("routing_key")
        self.transport_options = dict(options.get("transport_options") or {})
        self.refusals = REFUSALS
        self.connection = connection = Connection(
            url, transport_options=self.transport_options, **_heartbeat(url)
        )
        self.connection_errors = (*connection.connection_errors, *connection.channel_errors)
        self._consumer: Consumer | None = None
        self._received: list[Received] = []
        self._failed: Exception | None = None

    def open(self) -> None:
        self.connection.ensure_connection(max_retries=1)
        self._consumer = self.connection.Consumer(
            [self._queue()],
            on_message=self._on_message,
            on_decode_error=self._on_decode_error,
            prefetch_count=self.subscription.prefetch,
            auto_declare=self.subscription.declare,
        )
        self._consumer.consume()

    def receive(self, timeout: float) -> list[Received]:
        if self._failed is not None:
            failed, self._failed = self._failed, None
            raise failed
        self._received = []
        try:
            self.connection.drain_events(timeout=timeout)
        except TimeoutError:
            pass
        except Exception as exc:
            if not self._received:
                raise
            # Messages were handed over before the failure (kombu's SQS delivers a batch per
            # call): they are handled first, and the failure is raised by the next call.
            self._failed = exc
        received, self._received = self._received, []
        return received

    def idle(self) -> None:
        self.connection.heartbeat_check()

    def keepalive(self) -> None:
        """A heartbeat frame, sent without reading: RabbitMQ sees the consumer alive while it
        waits out a database outage (its missed-heartbeat check would close the connection
        after one interval of silence, and hand the prefetched messages to others)."""
        if not self.connection.heartbeat:
            return
        # A connection that is gone raises: the loop finds out when it reads.
        with contextlib.suppress(Exception):
            self.connection.connection.send_heartbeat()

    def close(self) -> None:
        try:
            if self._consumer is not None:
                self._consumer.cancel()
        except Exception:  # the connection is gone: nothing to cancel
            pass
        try:
            self.connection.release()
        except (OSError, *self.connection.connection_errors):
            pass

    def masked_url(self) -> str:
        return str(self.connection.as_uri())

    def describe(self) -> str:
        queue = f"queue {self.subscription.queue!r}"
        if not self.subscription.declare:
            return f"{queue} (not declared: it must exist)"
        declared = "declared durable if missing"
        if self.exchange:
            routing = self.routing_key or self.subscription.queue
            declared += (
                f", bound to {self.exchange_type} exchange {self.exchange!r} with key {routing!r}"
            )
        return f"{queue} ({declared})"

    def _queue(self) -> Queue:
        name = self.subscription.queue
        if self.exchange:
            exchange = Exchange(self.exchange, type=self.exchange_type, durable=True)
            return Queue(name, exchange, routing_key=self.routing_key or name, durable=True)
        return Queue(name, routing_key=name, durable=True)

    def _on_message(self, message: Any) -> None:
        self._received.append(Received(message))

    def _on_decode_error(self, message: Any, exc: BaseException) -> None:
        """kombu could not decode a message it delivered (a ``compression`` header it cannot
        apply): kept dead under its id with its raw body, or refused; never requeued."""
        self._received.append(Received(message, exc))
