"""SQS for the tests: a local SQS-compatible server (moto's server mode, installed from PyPI by
the test extra) started once per test session, queues of a test's own, and sending as other
producers do (message attributes, FIFO groups and deduplication ids)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3

REGION = "eu-west-1"
#: Credentials the local server accepts (any); boto3 needs some.
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def sqs_server() -> Iterator[str]:
    """moto's server on a free port; yields its endpoint URL."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("the local SQS server did not start") from None
            time.sleep(0.2)
    try:
        yield endpoint
    finally:
        process.kill()
        process.wait()


def client(endpoint: str) -> Any:
    return boto3.client("sqs", region_name=REGION, endpoint_url=endpoint, **CREDENTIALS)


@dataclass
class Queue:
    endpoint: str
    name: str
    url: str
    dead_letters: str | None = None

    @property
    def broker(self) -> str:
        return f"sqs+native://testing:testing@{REGION}?endpoint_url={self.endpoint}"

    @property
    def fifo(self) -> bool:
        return self.name.endswith(".fifo")


def new_queue(
    endpoint: str, *, fifo: bool = False, max_receives: int | None = None, visibility: int = 30
) -> Queue:
    """A new queue; with ``max_receives``, a dead-letter queue and a redrive policy after that
    many receives."""
    sqs = client(endpoint)
    name = f"inbox-test-{uuid.uuid4().hex[:10]}" + (".fifo" if fifo else "")
    attributes = {"VisibilityTimeout": str(visibility)}
    if fifo:
        attributes["FifoQueue"] = "true"
    dead_url = None
    if max_receives is not None:
        dead_name = name.replace(".fifo", "") + "-dead" + (".fifo" if fifo else "")
        dead_attributes = {"FifoQueue": "true"} if fifo else {}
        dead_url = sqs.create_queue(QueueName=dead_name, Attributes=dead_attributes)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=dead_url, AttributeNames=["QueueArn"])
        attributes["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": arn["Attributes"]["QueueArn"],
                "maxReceiveCount": str(max_receives),
            }
        )
    url = sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    return Queue(endpoint, name, url, dead_url)


def send(queue: Queue, messages: Iterable[dict[str, Any]]) -> int:
    """Send each message (``{"id", "type", "body", "attributes", "group", "dedup"}``): its id
    and type as the ``message_id`` and ``event_type`` attributes, in batches of 10."""
    sqs = client(queue.endpoint)
    batch: list[dict[str, Any]] = []
    count = 0

    def flush() -> None:
        if batch:
            answer = sqs.send_message_batch(QueueUrl=queue.url, Entries=batch)
            assert not answer.get("Failed"), answer["Failed"]
            batch.clear()

    for message in messages:
        body = message.get("body")
        if not isinstance(body, str):
            body = json.dumps(body)
        attributes = {
            name: {"DataType": "String", "StringValue": str(value)}
            for name, value in (message.get("attributes") or {}).items()
        }
        if message.get("id") is not None:
            attributes["message_id"] = {"DataType": "String", "StringValue": message["id"]}
        if message.get("type") is not None:
            attributes["event_type"] = {"DataType": "String", "StringValue": message["type"]}
        entry: dict[str, Any] = {"Id": str(count), "MessageBody": body}
        if attributes:
            entry["MessageAttributes"] = attributes
        if queue.fifo:
            entry["MessageGroupId"] = message.get("group") or "g"
            entry["MessageDeduplicationId"] = message.get("dedup") or uuid.uuid4().hex
        batch.append(entry)
        count += 1
        if len(batch) == 10:
            flush()
    flush()
    return count


def depth(url: str, endpoint: str) -> int:
    """Messages in the queue, visible or hidden."""
    found = client(endpoint).get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(found["ApproximateNumberOfMessages"]) + int(
        found["ApproximateNumberOfMessagesNotVisible"]
    )
