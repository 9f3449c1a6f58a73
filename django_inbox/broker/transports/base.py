"""What a broker is to ``inbox_consume``: one small interface, one module per broker.

The consume loop (:class:`~django_inbox.broker.connection.BrokerConsumer`), the envelope rules
(:mod:`~django_inbox.broker.envelope`: the message id, the event type, the refusal of a message
without an id) and the acknowledgement policy (:mod:`~django_inbox.broker.acking`: after the
commit, ``--ack``, ``--commit-every``) are shared. A transport only moves messages:

- :meth:`Transport.open` connects and subscribes (declaring what ``declare`` allows);
- :meth:`Transport.receive` hands over what arrived, waiting at most ``timeout`` seconds
  (``0``: only what is already here), as :class:`Delivery` objects;
- each :class:`Delivery` is acknowledged (:meth:`~Delivery.ack`, after the inbox committed),
  refused (:meth:`~Delivery.reject`: to the broker's dead letters, never redelivered) or given
  back (:meth:`~Delivery.requeue`: delivered again, to this consumer or another);
- :meth:`Transport.idle` keeps the connection alive between waits;
- :meth:`Transport.close` lets go; what was not acknowledged is redelivered by the broker.

Where the broker takes several acknowledgements in one call (``XACK`` with many ids, SQS's
``DeleteMessageBatch``, JetStream's acks sent in one hop to the client's thread), a transport
holds them (:meth:`Transport.hold_ack`) and the loop sends them together
(:meth:`Transport.flush_acks`): when :attr:`~Transport.ack_batch` are held or the oldest has
waited :data:`ACK_DELAY` seconds (it asks after each message), before each receive, and when
it stops, also on an error that ends the command (not on a lost connection). Each
was committed before it was held, so an acknowledgement lost with a killed process or a broken
connection only makes the broker deliver a committed message again, which the inbox answers
as a duplicate: a plain consumer cannot wait like this, since each redelivery would run its
handler again.

A transport says which of its errors mean a lost connection (:attr:`Transport.connection_errors`,
reconnected with backoff) and which a refusal of the configuration
(:attr:`Transport.refusals`: exit 2 when opening; an error of one delivery's acknowledgement
is counted as the transport's fault instead, so that one message never ends the command). A
redelivery reaches the inbox as ``delivery_info["redelivered"]`` (each transport sets it from
its broker's delivery count, kept beside it as ``delivery_count``), which is how a message that
kills its consumer every time ends ``dead`` after its attempts instead of looping. A delivery
that can keep a refusal's reason has a ``refused_because`` attribute, which the loop sets.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol
from urllib.parse import urlsplit

from ..envelope import BrokerMessage

#: Seconds the oldest held acknowledgement may wait for the others of its batch.
ACK_DELAY = 1.0


class Delivery(BrokerMessage, Protocol):
    """One message as a transport hands it over: what the envelope reads (kombu's message
    attributes, :class:`~django_inbox.broker.envelope.BrokerMessage`, which the other
    transports imitate) and what the loop does with it."""

    def ack(self) -> None: ...

    def reject(self, requeue: bool = False) -> None: ...

    def requeue(self) -> None: ...


def masked(url: str) -> str:
    """``url`` with its password, if any, written ``**``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=f"{parts.username or ''}:**@{host}").geturl()


@dataclass
class Received:
    """A delivery and, when the transport could not decode it, why (it is then kept dead under
    its id with its raw body, or refused)."""

    message: Any
    error: BaseException | None = None


@dataclass
class Subscription:
    """What to consume and how, the same for every transport."""

    #: The inbox consumer (a durable consumer or group is named after it where the broker
    #: names them).
    consumer: str
    #: The queue, subject or stream.
    queue: str
    #: Messages handed over and not yet acknowledged, at most.
    prefetch: int = 100
    #: Create what is missing (queue, binding, consumer group); off for pre-provisioned brokers.
    declare: bool = True
    #: Seconds a delivery may stay unacknowledged before the broker hands it to another
    #: consumer, where the broker has such a timeout (JetStream's ack wait, SQS's visibility
    #: timeout, the age after which Redis Streams entries are claimed).
    lease: float = 300.0
    #: The transport's own options (kombu's transport options; AMQP's exchange and binding).
    options: Mapping[str, Any] = field(default_factory=dict)


class Transport(ABC):
    """One broker connection of one consumer (see the module)."""

    #: URL schemes this transport serves.
    schemes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, url: str, subscription: Subscription) -> None:
        self.url = url
        self.subscription = subscription
        #: Errors meaning the connection (or channel) is gone: the loop reconnects. Known
        #: before :meth:`open` (the loop reads them when opening fails).
        self.connection_errors: tuple[type[BaseException], ...] = ()
        #: Errors meaning the broker refused the configuration: the command exits 2.
        self.refusals: tuple[type[BaseException], ...] = ()
        #: Acknowledgements sent in one call at most (1: each is sent at once).
        self.ack_batch = 1
        self._held: list[Any] = []
        self._held_since = 0.0

    @abstractmethod
    def open(self) -> None:
        """Connect and subscribe; raise one of :attr:`connection_errors` if the broker cannot
        be reached, one of :attr:`refusals` if it refuses what was asked."""

    @abstractmethod
    def receive(self, timeout: float) -> list[Received]:
        """What arrived, waiting at most ``timeout`` seconds; ``[]`` when nothing did."""

    def hold_ack(self, item: Any) -> None:
        """Acknowledge ``item`` (whatever :meth:`send_acks` takes) with the next batch. Never
        sends a held batch itself: the loop does (:meth:`acks_due`, :meth:`flush_acks`), so
        that a failure to send is the transport's fault, never the message's at hand."""
        if self.ack_batch <= 1:
            self.send_acks([item])
            return
        if not self._held:
            self._held_since = time.monotonic()
        self._held.append(item)

    def acks_due(self) -> bool:
        """Whether the held acknowledgements should go now: a batch's worth, or the oldest has
        waited :data:`ACK_DELAY` seconds (the loop asks after each message)."""
        return bool(self._held) and (
            len(self._held) >= self.ack_batch or time.monotonic() - self._held_since >= ACK_DELAY
        )

    def flush_acks(self) -> None:
        """Send the held acknowledgements now (the loop calls this before each receive, when
        :meth:`acks_due`, and before it stops)."""
        held, self._held = self._held, []
        if held:
            self.send_acks(held)

    def send_acks(self, items: list[Any]) -> None:
        """Acknowledge ``items`` at the broker, in as few calls as it allows (transports that
        hold acknowledgements implement it)."""
        raise NotImplementedError

    def idle(self) -> None:  # noqa: B027 (most transports need nothing)
        """Nothing arrived and nothing is pending: keep the connection alive."""

    def keepalive(self) -> None:  # noqa: B027 (most transports need nothing)
        """The loop waits for the database with a message held: tell the broker it is alive
        without reading (what arrives must wait). Never raises."""

    @abstractmethod
    def close(self) -> None:
        """Let go of the connection; never raises."""

    @abstractmethod
    def masked_url(self) -> str:
        """The URL without its password, for log lines."""

    @abstractmethod
    def describe(self) -> str:
        """What is consumed, for the start line (``queue 'x' (declared durable if missing)``)."""

    @property
    def scheme(self) -> str:
        return self.url.split("://", 1)[0]
