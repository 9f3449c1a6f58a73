"""Publishing a batch to an AMQP broker with publisher confirms, and learning each message's fate.

Every message of a batch is published on one channel in confirm mode, ``persistent`` and
``mandatory``, without waiting; then the broker's confirms are awaited together. A message
is *confirmed* only when the broker acknowledged it and did not return it: RabbitMQ returns an
unroutable ``mandatory`` message (``basic.return``) before it acknowledges it, so such a
message is reported as failed, never as sent. A negative acknowledgement, a closed channel or
connection, or a confirm that does not come in time leaves the messages concerned
unconfirmed: the relay publishes them again later (the receiver deduplicates by message id).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kombu.connection import Connection

from .. import tracing
from ..db.json import unreadable
from .headers import check_table
from .rows import Claimed

#: AMQP reply code of a returned (unroutable) message.
NO_ROUTE = 312
#: Seconds an exchange the broker said it has is trusted without asking again.
EXCHANGE_CHECKED_FOR = 10.0


@dataclass
class BatchResult:
    """What became of a batch: row ids the broker confirmed, and errors by row id."""

    confirmed: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    #: Rows whose fate is unknown (the connection broke first): publish them again.
    unknown: list[int] = field(default_factory=list)
    #: Rows that cannot be made into an AMQP message at all (a header value AMQP cannot
    #: carry): dead at once, with the reason.
    unsendable: dict[int, str] = field(default_factory=dict)


class BrokerGone(Exception):
    """The connection to the broker broke; the relay reconnects. ``result`` says what the
    broker had confirmed of the batch before (the rest is ``unknown``)."""

    def __init__(self, reason: str, result: BatchResult | None = None) -> None:
        super().__init__(reason)
        self.result = result or BatchResult()


class BrokerUnreachable(Exception):
    """The broker was never reached within the relay's ``wait_for_broker`` seconds."""


class Publisher:
    """One connection and one confirm-mode channel to an AMQP broker (kombu's ``pyamqp``)."""

    def __init__(
        self, url: str, *, transport_options: dict[str, Any] | None = None, timeout: float = 30
    ) -> None:
        self.timeout = timeout
        self.connection: Any = Connection(  # type: ignore[no-untyped-call]
            url, transport_options=transport_options or {}, connect_timeout=min(timeout, 10)
        )
        if self.connection.transport.driver_type != "amqp":
            raise ValueError(
                f"outbox_relay needs an AMQP broker (publisher confirms); got a "
                f"{self.connection.transport.driver_type!r} URL"
            )
        self.channel: Any = None
        self._tag = 0
        self._acked: set[int] = set()
        self._nacked: set[int] = set()
        #: Tags published on this channel and not confirmed yet.
        self._unconfirmed: set[int] = set()
        self._returned: dict[str, str] = {}
        #: Exchanges the broker said it has, and when.
        self._exchanges: dict[str, float] = {}

    def open(self) -> None:
        """Connect (once; raises on failure) and open a confirm-mode channel."""
        self.connection.ensure_connection(max_retries=1)
        self._open_channel()

    def _open_channel(self) -> None:
        channel = self.connection.channel()
        channel.confirm_select()
        channel.events["basic_ack"].add(self._on_ack)
        channel.events["basic_nack"].add(self._on_nack)
        channel.events["basic_return"].add(self._on_return)
        self.channel, self._tag = channel, 0
        self._unconfirmed.clear()
        self._acked.clear()
        self._nacked.clear()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken connection: nothing to do
            self.connection.release()

    def _on_ack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(self._acked, delivery_tag, multiple)

    def _on_nack(self, delivery_tag: int, multiple: bool) -> None:
        self._settle(self._nacked, delivery_tag, multiple)

    def _settle(self, into: set[int], delivery_tag: int, multiple: bool) -> None:
        """A confirm for ``delivery_tag`` and, with ``multiple``, for every earlier tag still
        unconfirmed (a ``multiple`` nack does not undo the acks that came before it)."""
        tags = {tag for tag in self._unconfirmed if tag <= delivery_tag} if multiple else set()
        tags.add(delivery_tag)
        into.update(tags)
        self._unconfirmed.difference_update(tags)

    def _on_return(self, exc: Any, exchange: str, routing_key: str, message: Any) -> None:
        message_id = (getattr(message, "properties", None) or {}).get("message_id")
        if message_id:
            self._returned[str(message_id)] = (
                f"unroutable: the broker returned it ({exc}); exchange {exchange!r}, "
                f"routing key {routing_key!r}: no queue is bound to receive it"
            )

    def publish(self, rows: Iterable[Claimed]) -> BatchResult:
        """Publish ``rows`` in order and wait for the broker's confirms."""
        import amqp

        result = BatchResult()
        tags: dict[int, Claimed] = {}
        self._returned.clear()
        rows = list(rows)
        try:
            missing = self._missing_exchanges(rows)
            for row in rows:
                if row.exchange in missing:  # never published: the channel stays open
                    result.failed[row.pk] = missing[row.exchange]
                    continue
                try:
                    message = _message(row, self._frame_max())
                except Exception as exc:  # not encodable as AMQP: it never will be
                    result.unsendable[row.pk] = (
                        f"cannot be published: {type(exc).__name__}: {exc}"
                    )[:500]
                    continue
                self._tag += 1
                tags[self._tag] = row
                self._unconfirmed.add(self._tag)
                destination = row.exchange or row.routing_key
                with tracing.publish_span(row.headers, destination, row.message_id):
                    self.channel.basic_publish(
                        message, exchange=row.exchange, routing_key=row.routing_key, mandatory=True
                    )
            self._await(set(tags))
            # Settled inside the try: the ``finally`` below forgets this batch's tags.
            for tag, row in tags.items():
                if row.message_id in self._returned:
                    result.failed[row.pk] = self._returned[row.message_id]
                elif tag in self._nacked:
                    result.failed[row.pk] = "the broker refused it (negative acknowledgement)"
                else:
                    result.confirmed.append(row.pk)
            return result
        except amqp.exceptions.ChannelError as exc:
            # The broker closed the channel (an exchange deleted since it was checked, a
            # refused message). Alone, the row is the one refused; in a batch, the rows without
            # a confirm are published again one by one, so only the refused one fails (those
            # the broker took before it, their confirms lost, go out twice).
            self._exchanges.clear()
            confirmed = [
                row.pk
                for tag, row in tags.items()
                if tag in self._acked and row.message_id not in self._returned
            ]
            settled = {*confirmed, *result.unsendable, *result.failed}
            unconfirmed = [row for row in rows if row.pk not in settled]
            result.confirmed = confirmed
            self._reopen()
            if len(rows) == 1:
                result.failed[rows[0].pk] = f"refused by the broker: {exc}"
                return result
            for index, row in enumerate(unconfirmed):
                try:
                    alone = self.publish([row])
                except BrokerGone as gone:
                    result.confirmed += gone.result.confirmed
                    result.unknown += gone.result.unknown
                    result.unknown += [later.pk for later in unconfirmed[index + 1 :]]
                    raise BrokerGone(str(gone), result) from gone
                result.confirmed += alone.confirmed
                result.failed.update(alone.failed)
                result.unsendable.update(alone.unsendable)
            return result
        except (TimeoutError, OSError, amqp.exceptions.ConnectionError) as exc:
            for tag, row in tags.items():
                if tag in self._acked and row.message_id not in self._returned:
                    result.confirmed.append(row.pk)
                else:
                    result.unknown.append(row.pk)
            settled = {*result.confirmed, *result.unknown, *result.unsendable}
            result.unknown += [row.pk for row in rows if row.pk not in settled]
            raise BrokerGone(str(exc) or type(exc).__name__, result) from exc
        finally:
            # Delivery tags are never reused on a channel: forget this batch's.
            self._acked.difference_update(tags)
            self._nacked.difference_update(tags)
            self._unconfirmed.difference_update(tags)

    def _missing_exchanges(self, rows: list[Claimed]) -> dict[str, str]:
        """Why the broker refuses each exchange of ``rows`` that it does not have, asked with
        a passive declare before anything is published: a publication to a missing exchange
        closes the channel, and the confirms of the batch's earlier rows with it. An exchange
        that exists is trusted for :data:`EXCHANGE_CHECKED_FOR` seconds; one that does not is
        asked about again in every batch."""
        import amqp

        now = time.monotonic()
        missing: dict[str, str] = {}
        for name in dict.fromkeys(row.exchange for row in rows if row.exchange):
            if len(name.encode("utf-8")) > 255:
                continue  # no AMQP name: _message() says so for its rows (py-amqp cannot ask)
            if now - self._exchanges.get(name, -EXCHANGE_CHECKED_FOR) < EXCHANGE_CHECKED_FOR:
                continue
            try:
                self.channel.exchange_declare(name, "direct", passive=True)
            except amqp.exceptions.ChannelError as exc:  # the broker closed the channel
                missing[name] = f"refused by the broker: {exc}"
                self._reopen()
            else:
                self._exchanges[name] = now
        return missing

    def _frame_max(self) -> int:
        """The connection's negotiated frame size (AMQP's default if unknown)."""
        found = getattr(getattr(self.connection, "connection", None), "frame_max", None)
        return int(found) if found else 131072

    def _await(self, tags: set[int]) -> None:
        if not tags:
            return
        deadline = time.monotonic() + self.timeout
        while not tags <= (self._acked | self._nacked):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no confirm from the broker within {self.timeout:g}s")
            try:
                self.connection.drain_events(timeout=min(left, 1.0))
            except TimeoutError:
                continue

    def _reopen(self) -> None:
        try:
            self._open_channel()
        except Exception as exc:
            raise BrokerGone(f"could not reopen a channel: {exc}") from exc


def _message(row: Claimed, frame_max: int) -> Any:
    """The AMQP message of ``row``, encoded now (so that a value AMQP cannot carry raises
    here, before anything is written to the connection): a routing key or exchange over 255
    bytes, a header AMQP cannot encode, properties that do not fit one frame."""
    import amqp

    why = unreadable(payload=row.payload, headers=row.headers)
    if why:
        raise ValueError(why)
    for name, value in (("exchange", row.exchange), ("routing key", row.routing_key)):
        if len(value.encode("utf-8")) > 255:
            raise ValueError(f"the {name} is over 255 bytes of UTF-8")
    message = amqp.Message(
        body=json.dumps(row.payload, ensure_ascii=False, separators=(",", ":")),
        content_type="application/json",
        content_encoding="utf-8",
        message_id=row.message_id,
        type=row.event_type,
        delivery_mode=2,
        application_headers=dict(row.headers),
    )
    try:
        properties = message._serialize_properties()  # raises for a value AMQP cannot encode
    except Exception:
        check_table(row.headers, "headers")  # says which header and why (a row from before
        raise  # publish() checked its headers), or py-amqp's own error if not that
    if len(properties) > frame_max - 64:
        raise ValueError(
            f"its headers take {len(properties)} bytes; the broker's frames hold {frame_max}"
        )
    return message
