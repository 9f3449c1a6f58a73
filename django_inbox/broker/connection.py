"""The loop behind ``manage.py inbox_consume``: broker messages into the inbox, acked after commit.

Each message is acknowledged only after the inbox committed it: processed (``after-process``)
or stored (``after-store``). A crash before the ack makes the broker redeliver, and the inbox
answers the copy as a duplicate. Nothing is acknowledged that was not committed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from django.utils.module_loading import import_string
from kombu.exceptions import OperationalError as BrokerUnavailable

from ..conf import inbox_settings
from ..db.outage import DatabaseMisconfigured
from ..processing.retry import Backoff
from ..processing.shutdown import Shutdown
from ..processing.worker import Worker
from ..text import exception_text
from .acking import Acker, ConsumeStats
from .envelope import Envelope
from .faults import TransportFaults
from .intake import AckMode, Intake
from .transports import Received, Subscription, Transport, transport_class

__all__ = ["AckMode", "BrokerConsumer", "BrokerMisconfigured", "BrokerUnreachable", "ConsumeStats"]

logger = logging.getLogger("django_inbox")


class BrokerMisconfigured(Exception):
    """The broker refused the credentials, the queue or its declaration."""


class BrokerUnreachable(Exception):
    """The broker was never reached within ``wait_for_broker`` seconds."""


class BrokerConsumer:
    """Consume one queue into one inbox consumer until told to stop.

    Args:
        consumer: the inbox consumer the messages are for (its handlers run them).
        queue: the broker queue to read (a NATS subject, a Redis stream).
        broker_url: a kombu URL (``amqp://``, ``redis://``, ``sqs://``, ``filesystem://``),
            ``nats://`` (JetStream) or ``redis+streams://`` (:mod:`.transports`).
        transport_options: kombu transport options (e.g. Redis/SQS visibility timeout).
        exchange, exchange_type, routing_key: bind the queue to this exchange when declaring.
        declare: declare the queue (and exchange and binding); off for pre-provisioned brokers.
        prefetch: unacknowledged messages the broker may hand this process at once.
        ack_mode: ``after-process`` (default) or ``after-store``.
        process_due: also run the consumer's due retries and abandoned rows between
            messages (default: on in ``after-process`` mode, off in ``after-store`` mode).
        commit_every: in ``after-process`` mode, deliver up to this many messages that are
            already waiting in one transaction
            (:func:`~django_inbox.intake.batches.deliver_batch`) and acknowledge them
            after its commit (default: the consumer's ``commit_every``).
        max_messages: stop after this many broker messages.
        until_idle: stop once no message arrived for this many seconds.
        wait_for_broker: give up (:class:`BrokerUnreachable`) if the broker was not reached
            within this many seconds of starting; ``None`` waits for ever. Once reached, a
            lost broker is always waited for.
        shutdown: stop requests (signals).
        envelope: reads a kombu message into an :class:`Envelope` (``INBOX_ENVELOPE``;
            :func:`~django_inbox.broker.envelope.parse` by default).
        on_message_done: called with ``(message_id, outcome, seconds)`` after each message
            is acknowledged or refused (``inbox_consume -v 2`` prints it).
    """

    tick = 0.5  # seconds drain_events waits before the loop looks around

    def __init__(
        self,
        *,
        consumer: str,
        queue: str,
        broker_url: str,
        transport_options: dict[str, Any] | None = None,
        exchange: str | None = None,
        exchange_type: str = "direct",
        routing_key: str | None = None,
        declare: bool = True,
        prefetch: int = 100,
        ack_mode: AckMode = AckMode.AFTER_PROCESS,
        process_due: bool | None = None,
        commit_every: int | None = None,
        max_messages: int | None = None,
        until_idle: float | None = None,
        wait_for_broker: float | None = None,
        shutdown: Shutdown | None = None,
        envelope: Callable[..., Envelope] | None = None,
        on_message_done: Callable[[str | None, str, float], None] | None = None,
    ) -> None:
        self.consumer = consumer
        self.queue_name = queue
        self.broker_url = broker_url
        self.transport_options = dict(transport_options or {})
        self.exchange = exchange
        self.exchange_type = exchange_type
        self.routing_key = routing_key
        self.declare = declare
        self.prefetch = prefetch
        self.ack_mode = AckMode(ack_mode)
        self.process_due = (
            self.ack_mode is AckMode.AFTER_PROCESS if process_due is None else process_due
        )
        self.commit_every = commit_every or inbox_settings.policy(consumer).commit_every
        self.max_messages = max_messages
        self.until_idle = until_idle
        self.wait_for_broker = wait_for_broker
        self.shutdown = shutdown or Shutdown()
        self.on_message_done = on_message_done
        self.using = inbox_settings.database
        intake = Intake(
            consumer=consumer,
            queue_name=queue,
            ack_mode=self.ack_mode,
            batching=self.commit_every > 1 and self.ack_mode is AckMode.AFTER_PROCESS,
            envelope=envelope or import_string(inbox_settings.envelope),
            raw_limit=inbox_settings.max_payload_bytes // 2,
        )
        self.acker = Acker(
            intake,
            using=self.using,
            commit_every=self.commit_every,
            shutdown=self.shutdown,
            on_message_done=on_message_done,
        )
        self.stats = self.acker.stats
        self._last_message = time.monotonic()
        self._last_sweep = 0.0
        self._idle_out = False
        self._reached = False
        self.faults = TransportFaults(consumer, queue, broker_url.split(":", 1)[0], self.stats)

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> ConsumeStats:
        backoff = Backoff()
        self._idle_out = False
        started = time.monotonic()
        while not self._stopping() and not self._idle_out:
            transport = self.transport()
            lost: tuple[type[BaseException], ...] = (
                BrokerUnavailable,
                *transport.connection_errors,
            )
            try:
                self._consume(transport, backoff)
            except transport.refusals as exc:
                raise BrokerMisconfigured(
                    f"the broker refused queue {self.queue_name!r}: {type(exc).__name__}: {exc}"
                ) from exc
            except lost as exc:
                # Unacknowledged messages go back to the broker with the channel; nothing of
                # an open batch was committed, so it is simply dropped and redelivered.
                self.acker.pending = []
                waited = time.monotonic() - started
                if (
                    not self._reached
                    and self.wait_for_broker is not None
                    and waited >= self.wait_for_broker
                ):
                    raise BrokerUnreachable(
                        f"could not reach the broker at {transport.masked_url()} within "
                        f"{waited:.0f}s ({type(exc).__name__}: {exc}); check the URL, or "
                        "wait longer with --wait-for-broker"
                    ) from None
                self.stats.reconnects += 1
                delay = backoff.next()
                logger.warning(
                    "inbox_consume %s: broker connection %s (%s: %s); %s in %.1fs",
                    self.consumer,
                    "lost" if self._reached else "failed",
                    type(exc).__name__,
                    exc,
                    "reconnecting" if self._reached else "trying again",
                    delay,
                )
                self.shutdown.wait(delay)
            finally:
                transport.close()
        return self.stats

    def transport(self) -> Transport:
        """A new transport for :attr:`broker_url` (one per connection)."""
        subscription = Subscription(
            consumer=self.consumer,
            queue=self.queue_name,
            prefetch=self.prefetch,
            declare=self.declare,
            lease=inbox_settings.policy(self.consumer).lease,
            options={
                "exchange": self.exchange,
                "exchange_type": self.exchange_type,
                "routing_key": self.routing_key,
                "transport_options": self.transport_options,
            },
        )
        return transport_class(self.broker_url)(self.broker_url, subscription)

    def _consume(self, transport: Transport, backoff: Backoff) -> None:
        transport.open()
        if self._reached:
            logger.warning("inbox_consume %s: reconnected to the broker", self.consumer)
        self._reached = True
        # Idle time counts only while connected: an unreachable broker is not "idle".
        self._last_message = time.monotonic()
        self.acker.broken = transport.connection_errors
        self.acker.keepalive = transport.keepalive
        try:
            self._read(transport, backoff)
        except BaseException as exc:
            if not isinstance(exc, (*transport.connection_errors, BrokerUnavailable)):
                # The command ends (a database refusing its settings, an interrupt): the
                # acknowledgements held are of committed messages; send them if the broker
                # still answers, or they come back as duplicates.
                with contextlib.suppress(Exception):
                    transport.flush_acks()
            raise
        self._flush_acks(transport)

    def _read(self, transport: Transport, backoff: Backoff) -> None:
        """Receive and take messages until the loop is finished; the open batch committed."""
        broken = transport.connection_errors
        while not self._finished():
            self._flush_acks(transport)
            try:
                # While a batch is open, take only what is already here, then commit it.
                received = transport.receive(timeout=0 if self.acker.pending else self.tick)
            except Exception as exc:
                if isinstance(exc, (*broken, BrokerUnavailable, DatabaseMisconfigured)):
                    raise
                self.faults.met(exc)
                continue
            if not received:
                if self.acker.pending:
                    self.acker.flush()
                else:
                    transport.idle()
            for delivery in received:
                try:
                    self._on_message(delivery)
                    if transport.acks_due():
                        transport.flush_acks()
                except Exception as exc:
                    # Acknowledging or refusing failed (a stream's group deleted under it, a
                    # permission missing on a dead-letter queue): not the end of the command,
                    # nor a refusal of its configuration. Counted as the transport's faults;
                    # many in a row reconnect with backoff. Unacknowledged, it comes back.
                    if isinstance(exc, (*broken, BrokerUnavailable, DatabaseMisconfigured)):
                        raise
                    self.faults.met(exc, settling=True)
            # A connection that reads, not one that was merely opened, ends the backoff:
            # one that fails on every entry keeps backing off.
            backoff.reset()
            self._between_messages()
        self.acker.flush()

    def _flush_acks(self, transport: Transport) -> None:
        """Send the acknowledgements the transport holds (of committed messages) before it
        waits for more, and before the loop stops."""
        try:
            transport.flush_acks()
        except Exception as exc:
            if isinstance(exc, (*transport.connection_errors, BrokerUnavailable)):
                raise
            self.faults.met(exc, settling=True)

    def _stopping(self) -> bool:
        """No new message may start: a stop was asked for, or ``max_messages`` are taken."""
        if self.shutdown.requested:
            return True
        taken = self.stats.received + len(self.acker.pending)
        return self.max_messages is not None and taken >= self.max_messages

    def _finished(self) -> bool:
        if self._stopping():
            return True
        if self.acker.pending:
            return False
        idle = time.monotonic() - self._last_message
        # At least one tick: "--until-idle 0" means "until nothing is waiting".
        self._idle_out = self.until_idle is not None and idle >= max(self.until_idle, self.tick)
        return self._idle_out

    def _between_messages(self) -> None:
        if not self.process_due or self.shutdown.requested:
            return
        now = time.monotonic()
        if now - self._last_sweep < inbox_settings.poll_interval:
            return
        self._last_sweep = now
        sweep = Worker([self.consumer], shutdown=self.shutdown)
        try:
            handled = self.acker.with_database(sweep.run_once)
        except DatabaseMisconfigured:
            raise
        except Exception as exc:
            # Not the broker's messages: log it and go on consuming (the type and frames,
            # never the message, which may quote a payload).
            text = exception_text(exc)
            logger.error("inbox_consume %s: processing due rows failed: %s", self.consumer, text)
            return
        if handled:
            self._last_message = time.monotonic()  # retries are work: not idle

    def _on_message(self, delivery: Received) -> None:
        if self._stopping():
            # Delivered while the subscription was being cancelled, or past max_messages:
            # give it back untouched.
            self.acker.requeue(delivery.message)
            return
        self._last_message = time.monotonic()
        self.faults.passed()
        self.acker.take(delivery.message, delivery.error)
