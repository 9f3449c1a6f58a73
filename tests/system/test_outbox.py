"""The outbox companion against the real RabbitMQ: ``publish()`` in the caller's transaction,
and the relay publishing with confirms, marking rows sent, retrying and giving up."""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from kombu import Connection, Queue

from django_inbox import InvalidPayload, deliver, inbox_handler
from django_inbox.outbox import publish
from django_inbox.outbox.models import OutboxMessage
from django_inbox.outbox.relay import Relay
from tests import brokers

pytestmark = pytest.mark.django_db(transaction=True)
Status = OutboxMessage.Status
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def queue() -> Iterator[str]:
    with brokers.declared_queue("outbox-test") as name:
        yield name


def received(queue: str, limit: int = 10_000) -> list[Any]:
    """Every message waiting in ``queue``, acknowledged: (properties, headers, body)."""
    found = []
    with Connection(brokers.RABBITMQ) as connection:
        channel = connection.default_channel
        while len(found) < limit:
            message = channel.basic_get(queue, no_ack=True)
            if message is None:
                break
            found.append((message.properties, message.headers or {}, json.loads(message.body)))
    return found


def relay(**options: Any) -> Relay:
    return Relay(brokers.RABBITMQ, until_idle=0, poll_interval=0.01, **options)


def test_publish_writes_in_the_callers_transaction_and_rolled_back_work_publishes_nothing(
    queue: str,
) -> None:
    with transaction.atomic():
        kept = publish("order.placed", {"order": 1}, routing_key=queue, key="o-1")
    with pytest.raises(RuntimeError), transaction.atomic():
        publish("order.placed", {"order": 2}, routing_key=queue)
        raise RuntimeError("the business transaction fails")
    outside = publish("order.placed", {"order": 3}, routing_key=queue)
    assert list(OutboxMessage.objects.order_by("id").values_list("message_id", flat=True)) == [
        kept,
        outside,
    ]
    stats = relay().run()
    assert stats.sent == 2
    messages = received(queue)
    assert [(p["message_id"], p["type"], body) for p, _, body in messages] == [
        (kept, "order.placed", {"order": 1}),
        (outside, "order.placed", {"order": 3}),
    ]
    assert all(p["delivery_mode"] == 2 for p, _, _ in messages)
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {Status.SENT}


def test_publish_validates_as_deliver_does() -> None:
    for payload in ({"x": float("nan")}, {"x": "nul\x00"}, object()):
        with pytest.raises(InvalidPayload):
            publish("t", payload, routing_key="q")
    with override_settings(INBOX_MAX_PAYLOAD_BYTES=100), pytest.raises(ValueError):
        publish("t", {"x": "y" * 200}, routing_key="q")
    with pytest.raises(ValueError, match="routing_key"):
        publish("t", {}, routing_key="")
    assert not OutboxMessage.objects.exists()


def test_a_handler_publishing_records_its_message_as_the_cause(queue: str) -> None:
    @inbox_handler("order.paid", consumer="outbox-cause")
    def on_paid(message: Any) -> None:
        publish("receipt.due", {"order": message.payload["order"]}, routing_key=queue)

    try:
        deliver(
            consumer="outbox-cause", message_id="in-1", event_type="order.paid",
            payload={"order": 7}, headers={"traceparent": TRACEPARENT},
        )  # fmt: skip
    finally:
        from django_inbox.registry import registry

        registry.unregister("outbox-cause", "order.paid")
    row = OutboxMessage.objects.get()
    assert (row.causation_consumer, row.causation_message_id) == ("outbox-cause", "in-1")
    relay().run()
    [(_, headers, body)] = received(queue)
    assert body == {"order": 7}
    assert headers["x-causation-consumer"] == "outbox-cause"
    assert headers["x-causation-id"] == "in-1"
    assert headers["traceparent"] == TRACEPARENT


def test_an_unroutable_message_is_not_sent_and_ends_dead_after_its_attempts() -> None:
    with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=2, INBOX_OUTBOX_BACKOFF_BASE=0.01):
        publish("lost.event", {"n": 1}, routing_key="no-queue-has-this-name")
        Relay(brokers.RABBITMQ, until_idle=0.5, poll_interval=0.01).run()
    row = OutboxMessage.objects.get()
    assert (row.status, row.attempts) == (Status.DEAD, 2)
    assert "unroutable" in row.last_error and "no-queue-has-this-name" in row.last_error
    assert "giving up after 2 attempts" in row.last_error
    assert row.sent_at is None


def test_an_exchange_the_broker_refuses_ends_dead_and_the_relay_goes_on(queue: str) -> None:
    with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=1):
        publish("x", {"n": 1}, routing_key="r", exchange="no-such-exchange")
        publish("y", {"n": 2}, routing_key=queue)
        stats = Relay(brokers.RABBITMQ, until_idle=0.5, poll_interval=0.01).run()
    refused = OutboxMessage.objects.get(event_type="x")
    assert refused.status == Status.DEAD and "refused by the broker" in refused.last_error
    assert "NOT_FOUND" in refused.last_error
    assert OutboxMessage.objects.get(event_type="y").status == Status.SENT
    assert stats.sent == 1 and [p["type"] for p, _, _ in received(queue)] == ["y"]


def test_a_keys_rows_are_published_in_the_order_written(queue: str) -> None:
    for n in range(30):
        publish("v", {"n": n}, routing_key=queue, key=f"k{n % 3}")
    stats = relay(batch_size=7).run()
    assert stats.sent == 30
    by_key: dict[str, list[int]] = {}
    for _, _, body in received(queue):
        by_key.setdefault(f"k{body['n'] % 3}", []).append(body["n"])
    assert by_key == {f"k{k}": list(range(k, 30, 3)) for k in range(3)}


def test_a_row_left_held_by_a_race_is_published_by_the_next_relay(queue: str) -> None:
    """The second row of a key was written while the relay marked the first sent, and
    committed after the relay's release looked: only the relay's sweep makes it due."""
    first = publish("v", {"n": 0}, routing_key=queue, key="k")
    for n in (1, 2):  # held behind the first
        publish("v", {"n": n}, routing_key=queue, key="k")
    OutboxMessage.objects.filter(message_id=first).update(status=Status.SENT)  # no release
    stats = relay().run()
    assert stats.sent == 2
    assert [body["n"] for _, _, body in received(queue)] == [1, 2]
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {Status.SENT}


def test_messages_the_broker_nacks_are_not_sent() -> None:
    """A queue that rejects publications past its length makes RabbitMQ nack them."""
    name = brokers.new_queue_name("outbox-full")
    arguments = {"x-max-length": 2, "x-overflow": "reject-publish"}
    with Connection(brokers.RABBITMQ) as connection:
        Queue(name, routing_key=name, durable=True, queue_arguments=arguments)(
            connection.default_channel
        ).declare()
    try:
        with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=1):
            for n in range(5):
                publish("x", {"n": n}, routing_key=name)
            stats = Relay(brokers.RABBITMQ, until_idle=0.5, poll_interval=0.01).run()
        statuses = list(OutboxMessage.objects.order_by("id").values_list("status", flat=True))
        assert statuses == ["sent", "sent", "dead", "dead", "dead"]
        assert stats.sent == 2
        assert all(
            "negative acknowledgement" in error
            for error in OutboxMessage.objects.filter(status=Status.DEAD).values_list(
                "last_error", flat=True
            )
        )
        assert [body["n"] for _, _, body in received(name)] == [0, 1]
    finally:
        with Connection(brokers.RABBITMQ) as connection:
            Queue(name)(connection.default_channel).delete()


def test_a_header_amqp_cannot_carry_is_dead_at_once_and_its_batch_goes_on(queue: str) -> None:
    """A row written past publish()'s checks (by an older release, or by hand)."""
    publish("a", {"n": 1}, routing_key=queue)
    huge = publish("b", {"n": 2}, routing_key=queue)
    OutboxMessage.objects.filter(message_id=huge).update(headers={"huge": 2**70})
    publish("c", {"n": 3}, routing_key=queue)
    stats = relay().run()
    refused = OutboxMessage.objects.get(event_type="b")
    assert refused.status == Status.DEAD and refused.attempts == 1
    assert refused.last_error.startswith(
        "cannot be published: InvalidPayload: headers['huge'] is an integer of 71 bits; AMQP "
        "carries integers from -2**63 to 2**63-1"
    ), refused.last_error
    assert stats.sent == 2 and [p["type"] for p, _, _ in received(queue)] == ["a", "c"]


def test_rows_amqp_cannot_carry_are_dead_at_once_and_the_relay_goes_on(queue: str) -> None:
    """Rows written past publish()'s checks (by an older release, or by hand)."""
    publish("a", {"n": 1}, routing_key=queue)
    bad_key = publish("b", {"n": 2}, routing_key=queue)
    big = publish("c", {"n": 3}, routing_key=queue)
    publish("d", {"n": 4}, routing_key=queue)
    OutboxMessage.objects.filter(message_id=bad_key).update(routing_key="é" * 200)
    OutboxMessage.objects.filter(message_id=big).update(headers={"big": "x" * 200_000})
    stats = relay().run()
    assert stats.sent == 2 and stats.reconnects == 0
    assert [p["type"] for p, _, _ in received(queue)] == ["a", "d"]
    for message_id, said in ((bad_key, "over 255 bytes"), (big, "frames hold")):
        row = OutboxMessage.objects.get(message_id=message_id)
        assert row.status == Status.DEAD and said in row.last_error, row.last_error


def test_a_row_failing_a_thousand_times_is_retried_not_the_end_of_the_relay() -> None:
    """With a large INBOX_OUTBOX_MAX_ATTEMPTS, the backoff's doubling is capped before it
    overflows a float (2 ** 1025 does not fit one): the row is retried within the cap."""
    with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=10**6, INBOX_OUTBOX_BACKOFF_MAX=60):
        message_id = publish("lost.event", {"n": 1}, routing_key="no-queue-has-this-name")
        OutboxMessage.objects.filter(message_id=message_id).update(attempts=1100)
        stats = relay().run()
    row = OutboxMessage.objects.get()
    assert (row.status, row.attempts) == (Status.PENDING, 1101)
    assert stats.failed == {"pending": 1}
    assert row.next_attempt_at <= row.updated_at + timedelta(seconds=60)


def test_attempts_past_the_columns_range_end_the_row_dead_instead_of_the_relay() -> None:
    """``attempts`` is a 32-bit column: a setting above it ends a row dead at its limit, where
    the next claim's ``attempts + 1`` would raise in the database (and stop every relay)."""
    with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=10**12):
        message_id = publish("lost.event", {"n": 1}, routing_key="no-queue-has-this-name")
        OutboxMessage.objects.filter(message_id=message_id).update(attempts=2**31 - 2)
        relay().run()
    row = OutboxMessage.objects.get()
    assert (row.status, row.attempts) == (Status.DEAD, 2**31 - 1)
    assert "giving up after 2147483647 attempts" in row.last_error


def test_what_publish_accepts_at_amqps_limits_the_broker_takes(queue: str) -> None:
    """publish()'s checks are AMQP's: the extreme values it lets through are sent."""
    edges = {
        "max": 2**63 - 1, "min": -(2**63), "é" * 127 + "x": {"k" * 255: [None, 1.5, True]},
        "": "empty name", "list": [[], {}], "text": "x" * 60_000,
    }  # fmt: skip
    publish("edge", {}, routing_key=queue, headers=edges)
    stats = relay().run()
    assert stats.sent == 1 and not stats.failed
    [(_, headers, _)] = received(queue)
    assert headers == edges


def test_hostile_trace_headers_of_the_cause_are_dropped_and_the_event_is_sent(queue: str) -> None:
    """A 100 KB baggage made the event too large for its headers, and a traceparent of 2**64
    left a row the relay could never send: both are dropped, the rest goes out."""

    @inbox_handler("order.paid", consumer="outbox-trace")
    def on_paid(message: Any) -> None:
        publish("receipt.due", {"order": 1}, routing_key=queue)

    hostile = {"traceparent": 2**64, "tracestate": "a=b", "baggage": "k=" + "v" * 100_000}
    try:
        for n, headers in enumerate([hostile, {**hostile, "traceparent": TRACEPARENT}]):
            outcome = deliver(
                consumer="outbox-trace", message_id=f"in-{n}", event_type="order.paid",
                payload={}, headers=headers,
            )  # fmt: skip
            assert outcome == "processed"
    finally:
        from django_inbox.registry import registry

        registry.unregister("outbox-trace", "order.paid")
    stats = relay().run()
    assert stats.sent == 2 and not stats.failed
    first, second = (headers for _, headers, _ in received(queue))
    assert not {"traceparent", "tracestate", "baggage"} & set(first)
    assert (second["traceparent"], second["tracestate"]) == (TRACEPARENT, "a=b")
    assert "baggage" not in second


def test_a_row_for_a_missing_exchange_leaves_its_batch_mates_published_exactly_once(
    queue: str,
) -> None:
    """The broker closes the channel over a publication to an exchange that does not exist;
    the rows of the batch published before it lost their confirms and were published again
    (all 20 of 20 twice in the issue's run). Counted at the queue, per message id."""
    exchange = f"outbox-test-{uuid.uuid4().hex[:10]}"
    with Connection(brokers.RABBITMQ) as connection:
        channel = connection.default_channel
        channel.exchange_declare(exchange, "direct", durable=False, auto_delete=False)
        channel.queue_bind(queue, exchange, routing_key=queue)
    try:
        good = []
        with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=3, INBOX_OUTBOX_BACKOFF_BASE=0.01):
            for n in range(40):
                if n in (10, 30):
                    publish("bad", {"n": n}, routing_key=queue, exchange=f"missing-{exchange}")
                named = exchange if n % 2 else ""
                good.append(publish("good", {"n": n}, routing_key=queue, exchange=named))
            stats = Relay(brokers.RABBITMQ, until_idle=1, poll_interval=0.01).run()
        deliveries = Counter(p["message_id"] for p, _, _ in received(queue))
    finally:
        with Connection(brokers.RABBITMQ) as connection:
            connection.default_channel.exchange_delete(exchange)
    assert deliveries == dict.fromkeys(good, 1), sorted(deliveries.values())
    assert stats.sent == 40 and stats.failed == {"pending": 4, "dead": 2}, stats
    for row in OutboxMessage.objects.filter(event_type="bad"):
        assert row.status == Status.DEAD and "NOT_FOUND" in row.last_error, row.last_error


def test_inbox_stats_tells_failing_publications_from_nobody_relaying() -> None:
    """A relay running while the broker returns every publication was reported as "is a relay
    running?", as if none ran."""
    from django_inbox.services import collect

    def lag() -> str:
        [problem] = [p for p in collect(max_pending_age=60).problems if p.kind == "outbox_lag"]
        return problem.message

    for n in range(3):
        publish("lost.event", {"n": n}, routing_key="no-queue-has-this-name")
    old = timezone.now() - timedelta(minutes=10)
    OutboxMessage.objects.update(created_at=old, next_attempt_at=old)
    said = lag()  # nothing ever claimed them
    assert "nothing was sent (no sent message is kept) and no relay has claimed a due" in said
    assert "is a relay running, and can it reach its database and broker?" in said

    with override_settings(INBOX_OUTBOX_BACKOFF_BASE=300):  # due again well after this test
        stats = relay().run()
    assert stats.failed == {"pending": 3}
    said = lag()
    assert "is a relay running" not in said, said
    assert re.search(
        r"nothing was sent \(no sent message is kept\) and the attempts fail \(the next attempt "
        r"in \d+s\): the latest, attempt 1 of [-0-9a-f]{36} \d+s ago, failed: unroutable: the "
        r"broker returned it .*'no-queue-has-this-name'",
        said,
    ), said
