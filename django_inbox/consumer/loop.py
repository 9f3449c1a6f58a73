"""The loop behind ``manage.py inbox_consume``: broker messages into the inbox, acked after commit.

Each message is acknowledged only after the inbox committed it: processed (``after-process``)
or stored (``after-store``). A crash before the ack makes the broker redeliver, and the inbox
answers the copy as a duplicate. Nothing is acknowledged that was not committed.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from amqp.exceptions import AccessRefused, NotAllowed, NotFound, PreconditionFailed
from django.db import DatabaseError, InterfaceError, close_old_connections, connections
from django.utils.module_loading import import_string
from kombu.connection import Connection
from kombu.entity import Exchange, Queue
from kombu.exceptions import OperationalError as BrokerUnavailable

from ..conf import inbox_settings
from ..delivery import deliver, deliver_batch, prepare, store, store_dead
from ..exceptions import InvalidMessage, InvalidMessageId, UnknownEventType
from ..observe import exception_text
from ..registry import registry
from ..shutdown import Shutdown
from ..storage import NewRow
from ..worker import Worker
from .envelope import Envelope

logger = logging.getLogger("django_inbox")


#: The broker refused what we asked for: retrying cannot help, the configuration must change.
REFUSALS = (AccessRefused, NotAllowed, NotFound, PreconditionFailed)


class BrokerMisconfigured(Exception):
    """The broker refused the credentials, the queue or its declaration."""


class AckMode(StrEnum):
    AFTER_PROCESS = "after-process"
    AFTER_STORE = "after-store"


@dataclass
class ConsumeStats:
    """What a consumer did: outcomes of delivered messages and what it did at the broker."""

    outcomes: Counter[str] = field(default_factory=Counter)
    acked: int = 0
    refused: int = 0
    requeued: int = 0
    reconnects: int = 0
    database_errors: int = 0

    @property
    def received(self) -> int:
        return self.acked + self.refused


class Backoff:
    """Exponential backoff with jitter for reconnecting: 0.5 s doubling to 30 s."""

    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    def next(self) -> float:
        self.failures += 1
        ceiling = min(self.cap, self.base * 2 ** min(self.failures - 1, 16))
        return float(ceiling / 2 + random.uniform(0, ceiling / 2))

    def reset(self) -> None:
        self.failures = 0


class BrokerConsumer:
    """Consume one queue into one inbox consumer until told to stop.

    Args:
        consumer: the inbox consumer the messages are for (its handlers run them).
        queue: the broker queue to read.
        broker_url: a kombu URL (``amqp://``, ``redis://``, ``sqs://``, ``filesystem://``).
        transport_options: kombu transport options (e.g. Redis/SQS visibility timeout).
        exchange, exchange_type, routing_key: bind the queue to this exchange when declaring.
        declare: declare the queue (and exchange and binding); off for pre-provisioned brokers.
        prefetch: unacknowledged messages the broker may hand this process at once.
        ack_mode: ``after-process`` (default) or ``after-store``.
        process_due: also run the consumer's due retries and abandoned rows between
            messages (default: on in ``after-process`` mode, off in ``after-store`` mode).
        commit_every: in ``after-process`` mode, deliver up to this many messages that are
            already waiting in one transaction (:func:`~django_inbox.delivery.deliver_batch`)
            and acknowledge them after its commit (default: the consumer's ``commit_every``).
        max_messages: stop after this many broker messages.
        until_idle: stop once no message arrived for this many seconds.
        shutdown: stop requests (signals).
        envelope: reads a kombu message into an :class:`Envelope` (``INBOX_ENVELOPE``;
            :func:`~django_inbox.consumer.envelope.parse` by default).
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
        shutdown: Shutdown | None = None,
        envelope: Callable[..., Envelope] | None = None,
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
        self.shutdown = shutdown or Shutdown()
        self.envelope = envelope or import_string(inbox_settings.envelope)
        self.stats = ConsumeStats()
        self._pending: list[tuple[Any, NewRow]] = []
        self._last_message = time.monotonic()
        self._last_sweep = 0.0
        self._idle_out = False

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> ConsumeStats:
        backoff = Backoff()
        self._idle_out = False
        while not self._stopping() and not self._idle_out:
            connection = Connection(self.broker_url, transport_options=self.transport_options)
            try:
                self._consume(connection, backoff)
            except REFUSALS as exc:
                raise BrokerMisconfigured(
                    f"the broker refused queue {self.queue_name!r}: {type(exc).__name__}: {exc}"
                ) from exc
            except (
                BrokerUnavailable,
                *connection.connection_errors,
                *connection.channel_errors,
            ) as exc:
                # Unacknowledged messages go back to the broker with the channel; nothing of
                # an open batch was committed, so it is simply dropped and redelivered.
                self._pending = []
                self.stats.reconnects += 1
                delay = backoff.next()
                logger.warning(
                    "inbox_consume %s: broker connection lost (%s: %s); reconnecting in %.1fs",
                    self.consumer,
                    type(exc).__name__,
                    exc,
                    delay,
                )
                self.shutdown.wait(delay)
            finally:
                _release(connection)
        close_old_connections()
        return self.stats

    def _consume(self, connection: Connection, backoff: Backoff) -> None:
        connection.ensure_connection(max_retries=1)
        queue = self._queue()
        with connection.Consumer(
            [queue],
            on_message=self._on_message,
            prefetch_count=self.prefetch,
            auto_declare=self.declare,
        ):
            if self.stats.reconnects:
                logger.warning("inbox_consume %s: reconnected to the broker", self.consumer)
            backoff.reset()
            # Idle time counts only while connected: an unreachable broker is not "idle".
            self._last_message = time.monotonic()
            while not self._finished():
                try:
                    # While a batch is open, take only what is already here, then commit it.
                    connection.drain_events(timeout=0 if self._pending else self.tick)
                except TimeoutError:
                    if self._pending:
                        self._flush()
                    else:
                        connection.heartbeat_check()
                self._between_messages()
            self._flush()

    def _queue(self) -> Queue:
        if self.exchange:
            exchange = Exchange(self.exchange, type=self.exchange_type, durable=True)
            return Queue(
                self.queue_name,
                exchange,
                routing_key=self.routing_key or self.queue_name,
                durable=True,
            )
        return Queue(self.queue_name, routing_key=self.queue_name, durable=True)

    def _stopping(self) -> bool:
        """No new message may start: a stop was asked for, or ``max_messages`` are taken."""
        if self.shutdown.requested:
            return True
        taken = self.stats.received + len(self._pending)
        return self.max_messages is not None and taken >= self.max_messages

    def _finished(self) -> bool:
        if self._stopping():
            return True
        if self._pending:
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
        try:
            if Worker([self.consumer], shutdown=self.shutdown).run_once():
                self._last_message = time.monotonic()  # retries are work: not idle
        except (DatabaseError, InterfaceError) as exc:
            self._database_error(exc)

    # -- one message ----------------------------------------------------------------------

    def _on_message(self, message: Any) -> None:
        if self._stopping():
            # Delivered while the subscription was being cancelled: give it back untouched.
            message.requeue()
            self.stats.requeued += 1
            return
        self._last_message = time.monotonic()
        close_old_connections()
        try:
            envelope = self.envelope(message, raw_limit=inbox_settings.max_payload_bytes // 2)
            action = self._handle(envelope, message)
            if action == "pending":
                if len(self._pending) >= self.commit_every:
                    self._flush()
                return
        except (DatabaseError, InterfaceError) as exc:
            # Nothing was committed (or a commit's fate is unknown): the broker keeps the
            # message and redelivers it; the inbox answers a committed one as a duplicate.
            self._database_error(exc)
            self._requeue(message)
            return
        except Exception as exc:
            # The type and the frames, not the message: it may quote the payload.
            logger.error(
                "inbox_consume %s: unexpected error; requeueing: %s",
                self.consumer,
                exception_text(exc),
            )
            self.stats.database_errors += 1
            self._requeue(message)
            return
        if action == "refuse":
            message.reject(requeue=False)
            self.stats.refused += 1
        else:
            message.ack()
            self.stats.acked += 1
            self.stats.database_errors = 0

    def _requeue(self, message: Any) -> None:
        message.requeue()
        self.stats.requeued += 1
        self.shutdown.wait(min(5.0, 0.1 * 2 ** min(self.stats.database_errors, 6)))

    def _flush(self) -> None:
        """Deliver the open batch in one transaction, then acknowledge its messages."""
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            outcomes = deliver_batch([row for _, row in batch])
        except (DatabaseError, InterfaceError) as exc:
            self._database_error(exc)
            for message, _ in batch[:-1]:
                message.requeue()
            self.stats.requeued += len(batch) - 1
            self._requeue(batch[-1][0])
            return
        for (message, _), outcome in zip(batch, outcomes, strict=True):
            self.stats.outcomes[outcome.value] += 1
            message.ack()
        self.stats.acked += len(batch)
        self.stats.database_errors = 0

    def _handle(self, envelope: Envelope, message: Any) -> str:
        if not envelope.message_id:
            self._flush()
            logger.error(
                "inbox_consume %s: refused a message without an id from queue %s (type %s); "
                "an id invented here would defeat deduplication",
                self.consumer,
                self.queue_name,
                envelope.event_type or "-",
            )
            return "refuse"
        fields: dict[str, Any] = {
            "consumer": self.consumer,
            "message_id": envelope.message_id,
            "event_type": envelope.event_type or "unknown",
            "headers": envelope.headers,
            "source": envelope.source[:255],
            "key": envelope.key[:255],
        }
        batchable = (
            self.commit_every > 1
            and self.ack_mode is AckMode.AFTER_PROCESS
            and not envelope.redelivered
            and not envelope.problem
            and envelope.event_type
            and registry.get(self.consumer, envelope.event_type) is not None
        )
        try:
            if batchable:
                self._pending.append((message, prepare(payload=envelope.payload, **fields)))
                return "pending"
            self._flush()  # keep arrival order: what came before is committed first
            if envelope.problem or not envelope.event_type:
                reason = envelope.problem or "the message has no event type"
                self._keep_dead(fields, envelope.payload, reason, "Undecodable")
                return "ack"
            if self.ack_mode is AckMode.AFTER_STORE:
                new = store(payload=envelope.payload, **fields)
                self.stats.outcomes["stored" if new else "duplicate"] += 1
                return "ack"
            outcome = deliver(payload=envelope.payload, redelivered=envelope.redelivered, **fields)
            self.stats.outcomes[outcome.value] += 1
            return "ack"
        except UnknownEventType as exc:
            logger.error(
                "inbox_consume %s: refused message %s: %s", self.consumer, envelope.message_id, exc
            )
            return "refuse"
        except InvalidMessageId as exc:
            logger.error(
                "inbox_consume %s: refused a message with an unusable id: %s", self.consumer, exc
            )
            return "refuse"
        except InvalidMessage as exc:
            # Kept dead without what could not be stored; the reason says what it was.
            self._flush()
            try:
                self._keep_dead(fields, {"refused": str(exc)}, str(exc), type(exc).__name__)
            except InvalidMessage:
                logger.error(
                    "inbox_consume %s: refused message %s: %s",
                    self.consumer,
                    envelope.message_id,
                    exc,
                )
                return "refuse"
            return "ack"

    def _keep_dead(self, fields: dict[str, Any], payload: Any, reason: str, kind: str) -> None:
        fields = dict(fields, event_type=str(fields["event_type"])[:255] or "unknown")
        try:
            store_dead(payload=payload, reason=reason, error_type=kind, **fields)
        except InvalidMessage:
            fields["headers"] = {}  # headers that cannot be stored must not lose the message
            store_dead(payload=payload, reason=reason, error_type=kind, **fields)
        self.stats.outcomes["dead"] += 1

    def _database_error(self, exc: BaseException) -> None:
        self.stats.database_errors += 1
        logger.error(
            "inbox_consume %s: database error (%s: %s); reconnecting",
            self.consumer,
            type(exc).__name__,
            str(exc).strip().splitlines()[0] if str(exc).strip() else "",
        )
        connection = connections[inbox_settings.database]
        try:
            connection.close()
        except Exception:  # the connection is gone already
            connection.connection = None


def _release(connection: Connection) -> None:
    try:
        connection.release()
    except (OSError, *connection.connection_errors):
        pass
