"""Amazon SQS, native (``sqs+native://``): SQS messages as SQS holds them, through boto3.

``sqs://`` is kombu's SQS transport, for messages kombu publishes (Celery, ``outbox_relay
--broker sqs://``): it reads kombu's envelope and no SQS attributes. ``sqs+native://`` reads
what any producer sends (an SDK, the CLI, SNS with raw delivery, EventBridge):

- the body as the payload; message attributes as headers (``message_id``, ``event_type``,
  ``ce-*``, ``traceparent``…); the id from a ``message_id`` or ``ce-id`` attribute, else a FIFO
  queue's ``MessageDeduplicationId``, else the body's ``id`` (never SQS's ``MessageId``, which
  is new on every send, so a duplicate would look new);
- ``ApproximateReceiveCount`` as the redelivery count (a message that kills its consumer every
  time ends ``dead`` after its attempts instead of cycling until the redrive policy);
- on a FIFO queue, the ``MessageGroupId`` is the ordering ``key`` unless the message names one;
- each receive hides the messages for the consumer's lease (``VisibilityTimeout``); a
  delivery is deleted after the inbox committed, made visible again at once when given back,
  and, when refused, sent with the reason to the queue's dead-letter queue (its
  ``RedrivePolicy``), else to a queue ``<name>-refused`` (created when ``declare`` allows; a
  queue without either is refused at start, exit 2), then deleted.

URL: ``sqs+native://[KEY_ID:SECRET@][REGION][?endpoint_url=http://HOST:PORT]`` (credentials and
region default to boto3's; ``endpoint_url`` for SQS-compatible servers). ``--queue`` is a queue
name (looked up, and created when ``declare`` allows: FIFO when the name ends ``.fifo``) or a
queue URL.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import boto3
import botocore.exceptions
from botocore.config import Config

from .base import Received, Subscription, Transport, masked
from .sqs_messages import SqsDelivery

logger = logging.getLogger("django_inbox")

#: SQS hands out at most this many messages per receive.
MAX_BATCH = 10
#: Error codes that no retry can help: the configuration must change.
REFUSED_CODES = (
    "AWS.SimpleQueueService.NonExistentQueue",
    "QueueDoesNotExist",
    "AccessDenied",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
    "InvalidAddress",
)
SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "MessageGroupId",
    "MessageDeduplicationId",
    "SequenceNumber",
    "SentTimestamp",
]


class SqsRefused(Exception):
    """SQS refused the queue or the credentials."""


class SqsUnavailable(Exception):
    """SQS did not answer, or answered with an error a retry may cure (throttling, 5xx)."""


def _translated(exc: Exception) -> Exception:
    if isinstance(exc, botocore.exceptions.ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in REFUSED_CODES:
            return SqsRefused(f"{code}: {exc}")
    return SqsUnavailable(f"{type(exc).__name__}: {exc}")


class SqsTransport(Transport):
    schemes = ("sqs+native",)

    def __init__(self, url: str, subscription: Subscription) -> None:
        super().__init__(url, subscription)
        self.connection_errors = (SqsUnavailable,)
        self.refusals = (SqsRefused,)
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        self.endpoint_url: str | None = (
            query["endpoint_url"][0] if "endpoint_url" in query else None
        )
        self.region = parts.hostname or None
        self.key_id = unquote(parts.username) if parts.username else None
        self.secret = unquote(parts.password) if parts.password else None
        self.visibility = max(math.ceil(subscription.lease), 1)
        self.ack_batch = MAX_BATCH  # DeleteMessageBatch takes ten
        self.client: Any = None
        self.queue_url = ""
        #: Where refused messages go: the dead-letter queue, else ``<name>-refused``.
        self.refused_queue = ""

    def call(self, operation: str, **arguments: Any) -> Any:
        """One SQS operation on the consumed queue, its errors translated."""
        arguments.setdefault("QueueUrl", self.queue_url)
        try:
            return getattr(self.client, operation)(**arguments)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translated(exc) from exc

    def open(self) -> None:
        try:
            self.client = boto3.client(
                "sqs",
                region_name=self.region or None,
                endpoint_url=self.endpoint_url,
                aws_access_key_id=self.key_id,
                aws_secret_access_key=self.secret,
                config=Config(retries={"max_attempts": 2}, connect_timeout=5, read_timeout=30),
            )
            self.queue_url = self._queue_url()
            self.refused_queue = self._refused_queue()
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translated(exc) from exc

    def _queue_url(self) -> str:
        queue = self.subscription.queue
        if queue.startswith(("https://", "http://")):
            return queue
        try:
            found: str = self.client.get_queue_url(QueueName=queue)["QueueUrl"]
            return found
        except botocore.exceptions.ClientError as exc:
            refused = _translated(exc)
            if not isinstance(refused, SqsRefused) or not self.subscription.declare:
                raise
        attributes = {"VisibilityTimeout": str(self.visibility)}
        if queue.endswith(".fifo"):
            attributes["FifoQueue"] = "true"
        created: str = self.client.create_queue(QueueName=queue, Attributes=attributes)["QueueUrl"]
        return created

    def _refused_queue(self) -> str:
        """The queue's dead-letter queue (its ``RedrivePolicy``), else ``<name>-refused``
        (created if ``declare``); :class:`SqsRefused` if neither exists."""
        found = self.client.get_queue_attributes(
            QueueUrl=self.queue_url, AttributeNames=["RedrivePolicy", "QueueArn"]
        )
        attributes = found.get("Attributes") or {}
        policy = attributes.get("RedrivePolicy")
        target = json.loads(policy).get("deadLetterTargetArn") if policy else None
        if target:
            return self._url_of_arn(target)
        name = attributes.get("QueueArn", self.subscription.queue).rsplit(":", 1)[-1]
        fifo = name.endswith(".fifo")
        refused = name.removesuffix(".fifo") + "-refused" + (".fifo" if fifo else "")
        try:
            return str(self.client.get_queue_url(QueueName=refused)["QueueUrl"])
        except botocore.exceptions.ClientError as exc:
            if not isinstance(_translated(exc), SqsRefused) or not self.subscription.declare:
                raise SqsRefused(
                    f"queue {name!r} has no redrive policy and there is no queue {refused!r}: "
                    "refused messages would have nowhere to go; give the queue a dead-letter "
                    "queue"
                ) from None
        created = self.client.create_queue(
            QueueName=refused, Attributes={"FifoQueue": "true"} if fifo else {}
        )
        logger.warning(
            "inbox_consume %s: queue %s has no redrive policy; refused messages go to %s",
            self.subscription.consumer,
            name,
            refused,
        )
        return str(created["QueueUrl"])

    def _url_of_arn(self, arn: str) -> str:
        parts = arn.split(":")  # arn:aws:sqs:REGION:ACCOUNT:NAME
        try:
            found = self.client.get_queue_url(QueueName=parts[-1], QueueOwnerAWSAccountId=parts[4])
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise _translated(exc) from exc
        return str(found["QueueUrl"])

    def send_acks(self, items: list[Any]) -> None:
        failed: list[dict[str, Any]] = []
        for start in range(0, len(items), MAX_BATCH):
            chunk = items[start : start + MAX_BATCH]
            entries = [{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(chunk)]
            found = self.call("delete_message_batch", Entries=entries)
            failed += found.get("Failed") or []
        if failed:
            # Committed messages the queue will deliver again (answered as duplicates then).
            logger.warning(
                "inbox_consume %s: SQS did not delete %d acknowledged message(s) (%s); they "
                "will be delivered again and answered as duplicates",
                self.subscription.consumer,
                len(failed),
                "; ".join(f"{f.get('Code')}: {f.get('Message')}" for f in failed[:3]),
            )

    def receive(self, timeout: float) -> list[Received]:
        wait = 0 if timeout <= 0 else min(max(math.ceil(timeout), 1), 20)
        found = self.call(
            "receive_message",
            MaxNumberOfMessages=min(self.subscription.prefetch, MAX_BATCH),
            WaitTimeSeconds=wait,
            VisibilityTimeout=self.visibility,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=SYSTEM_ATTRIBUTES,
            AttributeNames=SYSTEM_ATTRIBUTES,  # the older name, for servers that know only it
        )
        return [Received(SqsDelivery(self, message)) for message in found.get("Messages") or []]

    def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):  # nothing to let go of
                client.close()

    def masked_url(self) -> str:
        return masked(self.url)

    def describe(self) -> str:
        declared = "created if missing" if self.subscription.declare else "must exist"
        return (
            f"SQS queue {self.subscription.queue!r} ({declared}; visibility timeout "
            f"{self.visibility}s per receive)"
        )
