"""``django_inbox.broker.acking``: each broker message is acknowledged only once what it
became has committed. Messages travel through kombu's in-memory transport (the one the demo
embeds) into the real database; ``inbox_consume`` against RabbitMQ and Redis, under SIGKILL,
is in ``tests/system/test_consume.py``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Exchange, Queue

from django_inbox.broker.acking import Acker
from django_inbox.broker.envelope import parse
from django_inbox.broker.intake import Intake
from django_inbox.models import InboxMessage
from django_inbox.processing.shutdown import Shutdown
from django_inbox.services import AckMode

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
CONSUMER = "effects"


@pytest.fixture
def queue() -> Iterator[Any]:
    """A queue of kombu's in-memory transport, and a function that takes its next message."""
    with Connection("memory://") as connection:
        bound = Queue("acking-test", Exchange("acking-test"), "acking-test")(connection)
        bound.declare()
        bound.purge()
        yield connection, bound


def send(queue: Any, body: Any, **properties: Any) -> Any:
    """Publish ``body`` and take it back as the consumer would: a kombu message to ack."""
    connection, bound = queue
    connection.Producer().publish(
        json.dumps(body),
        exchange=bound.exchange,
        routing_key="acking-test",
        content_type="application/json",
        **properties,
    )
    message = bound.get(no_ack=False)
    assert message is not None
    return message


def not_json(queue: Any, message_id: str) -> Any:
    """A message whose body is not the JSON its content type says."""
    connection, bound = queue
    connection.Producer().publish(
        b"{not json",
        exchange=bound.exchange,
        routing_key="acking-test",
        content_type="application/json",
        content_encoding="utf-8",
        message_id=message_id,
        headers={"type": "effect.write"},
    )
    return bound.get(no_ack=False)


def acker(commit_every: int = 1) -> Acker:
    intake = Intake(
        consumer=CONSUMER,
        queue_name="acking-test",
        ack_mode=AckMode.AFTER_PROCESS,
        batching=commit_every > 1,
        envelope=parse,
        raw_limit=1024,
    )
    return Acker(intake, using="default", commit_every=commit_every, shutdown=Shutdown())


def effect(message_id: str) -> dict[str, Any]:
    return {"id": message_id, "type": "effect.write", "n": 1}


def test_a_message_is_acknowledged_once_its_row_committed(queue: Any) -> None:
    message = send(queue, effect("a-1"), message_id="a-1")
    acking = acker()
    acking.take(message)
    assert message.acknowledged and message._state == "ACK"
    assert InboxMessage.objects.get(message_id="a-1").status == Status.COMPLETED
    assert acking.stats.acked == 1 and acking.stats.outcomes["processed"] == 1


def test_a_redelivered_copy_is_acknowledged_as_a_duplicate(queue: Any) -> None:
    acking = acker()
    acking.take(send(queue, effect("a-2"), message_id="a-2"))
    copy = send(queue, effect("a-2"), message_id="a-2")
    acking.take(copy)
    assert copy._state == "ACK" and acking.stats.outcomes["duplicate"] == 1
    assert InboxMessage.objects.filter(message_id="a-2").count() == 1


def test_an_open_batch_is_acknowledged_only_when_it_commits(queue: Any) -> None:
    acking = acker(commit_every=3)
    first = [send(queue, effect(f"b-{i}"), message_id=f"b-{i}") for i in range(2)]
    for message in first:
        acking.take(message)
    assert [m.acknowledged for m in first] == [False, False]
    assert not InboxMessage.objects.filter(message_id__startswith="b-").exists()
    third = send(queue, effect("b-2"), message_id="b-2")
    acking.take(third)
    assert [m._state for m in [*first, third]] == ["ACK"] * 3
    assert InboxMessage.objects.filter(message_id__startswith="b-").count() == 3


def test_a_message_without_an_id_is_refused_and_nothing_is_stored(queue: Any) -> None:
    message = send(queue, {"type": "effect.write"})
    acking = acker()
    acking.take(message)
    assert message._state == "REJECTED" and acking.stats.refused == 1
    assert not InboxMessage.objects.exists()


def test_a_message_that_is_not_json_is_kept_dead_and_acknowledged(queue: Any) -> None:
    message = not_json(queue, "c-1")
    acking = acker()
    acking.take(message)
    assert message._state == "ACK"
    row = InboxMessage.objects.get(message_id="c-1")
    assert row.status == Status.DEAD and "Undecodable" in row.last_error


def test_a_message_kept_dead_commits_the_open_batch_first(queue: Any) -> None:
    acking = acker(commit_every=5)
    batched = send(queue, effect("d-1"), message_id="d-1")
    acking.take(batched)
    assert not batched.acknowledged
    dead = not_json(queue, "d-2")
    acking.take(dead)  # it commits on its own: what came before commits first
    assert batched._state == "ACK" and dead._state == "ACK"
    first, second = InboxMessage.objects.order_by("pk")
    assert (first.message_id, first.status) == ("d-1", Status.COMPLETED)
    assert (second.message_id, second.status) == ("d-2", Status.DEAD)
