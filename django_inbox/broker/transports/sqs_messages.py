"""SQS messages as the inbox reads them (:class:`SqsDelivery`: attributes as headers, the id's
sources, the receive count as redeliveries) and what settles them; the connection, the queues
and the receive loop are :mod:`.sqs`'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .sqs import SqsTransport


class SqsDelivery:
    """An SQS message as the envelope reads it (see :class:`~.base.Delivery`)."""

    def __init__(self, transport: SqsTransport, message: dict[str, Any]) -> None:
        self._transport = transport
        self._receipt = message["ReceiptHandle"]
        self.message = message
        body = message.get("Body") or ""
        self.body: bytes = body.encode("utf-8", "surrogatepass")
        headers: dict[str, Any] = {}
        for name, value in (message.get("MessageAttributes") or {}).items():
            if "StringValue" in value:
                headers[name] = value["StringValue"]
            elif "BinaryValue" in value:
                headers[name] = value["BinaryValue"]
        system = message.get("Attributes") or {}
        lowered = {name.lower() for name in headers}
        self.properties: dict[str, Any] = {}
        dedup = system.get("MessageDeduplicationId")
        if dedup and not lowered & {"message_id", "ce-id", "ce_id"}:
            self.properties["message_id"] = dedup
        group = system.get("MessageGroupId")
        if group and not lowered & {"ce-partitionkey", "ce_partitionkey", "partition_key", "key"}:
            headers["partition_key"] = group
        self.headers = headers
        content_type = headers.get("content_type") or headers.get("Content-Type")
        self.content_type: str | None = content_type if isinstance(content_type, str) else None
        self.content_encoding: str | None = "utf-8"
        try:
            count = int(system.get("ApproximateReceiveCount") or 1)
        except ValueError:
            count = 1
        self.delivery_info: dict[str, Any] = {
            "redelivered": count > 1,
            "delivery_count": count,
            "sqs_message_id": message.get("MessageId"),
        }
        self.refused_because = "refused by inbox_consume"

    def ack(self) -> None:
        self._transport.hold_ack(self._receipt)

    def requeue(self) -> None:
        self._transport.call(
            "change_message_visibility", ReceiptHandle=self._receipt, VisibilityTimeout=0
        )

    def reject(self, requeue: bool = False) -> None:
        if requeue:
            self.requeue()
            return
        transport = self._transport
        target = transport.refused_queue
        # The reason first: SQS takes at most 10 attributes, and it is the one that matters.
        attributes = {
            "x-inbox-refused": {"DataType": "String", "StringValue": self.refused_because[:1000]}
        }
        for name, value in (self.message.get("MessageAttributes") or {}).items():
            if len(attributes) < 10 and name != "x-inbox-refused":
                attributes[name] = value
        sent: dict[str, Any] = {
            "QueueUrl": target,
            "MessageBody": self.message.get("Body") or "",
            "MessageAttributes": attributes,
        }
        if target.endswith(".fifo"):
            system = self.message.get("Attributes") or {}
            sent["MessageGroupId"] = system.get("MessageGroupId") or "refused"
            sent["MessageDeduplicationId"] = self.message["MessageId"]
        transport.call("send_message", **sent)
        # Deleted at once, not held: a delete lost after the copy would refuse it again, and a
        # standard queue would keep a second copy.
        transport.call("delete_message", ReceiptHandle=self._receipt)
