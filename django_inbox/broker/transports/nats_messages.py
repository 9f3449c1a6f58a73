"""NATS JetStream messages as the inbox reads them (:class:`NatsDelivery`), and the durable
consumer's name for an inbox consumer. The connection and JetStream's consumer are in
:mod:`.nats`."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .nats import NatsTransport

#: Characters a durable consumer's name may hold as they are; others are escaped.
_NAME_SAFE = re.compile(r"[A-Za-z0-9-]")

#: Headers whose value must be text to be used: nats-py decodes header values as UTF-8 with
#: replacement characters, so one holding U+FFFD may have been bytes that were not UTF-8.
NAMING_HEADERS = (
    "nats-msg-id", "message_id", "ce-id", "ce_id", "ce-source", "ce_source", "ce-type",
    "ce_type", "event_type", "ce-partitionkey", "ce_partitionkey", "partition_key", "key",
)  # fmt: skip


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
        headers = {str(name): value for name, value in (message.headers or {}).items()}
        for name, value in headers.items():
            if name.lower() in NAMING_HEADERS and isinstance(value, str) and "\ufffd" in value:
                # Bytes that were not UTF-8, decoded with replacement characters: two
                # different ids could read the same. Kept as bytes that are not UTF-8, so the
                # envelope refuses the message (an id) or keeps it dead (a type or key).
                headers[name] = b"\xff" + value.encode("utf-8")
        self.headers: dict[str, Any] = headers
        self.body: bytes = message.data
        lowered = {str(name).lower(): value for name, value in headers.items()}
        self.content_type: str | None = lowered.get("content-type")
        self.content_encoding: str | None = None
        self.properties: dict[str, Any] = {}
        # JetStream's own deduplication id, when the publisher set one: the message id.
        if lowered.get("nats-msg-id"):
            self.properties["message_id"] = lowered["nats-msg-id"]
        self.refused_because = "refused by inbox_consume"
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
        self._transport.hold_ack(self._message)

    def reject(self, requeue: bool = False) -> None:
        if requeue:
            self.requeue()
        else:
            self._transport._call(self._transport._refuse(self))

    def requeue(self) -> None:
        self._transport._call(self._message.nak())
