"""``BrokerConsumer`` end to end against kombu's in-memory transport, in this process.

``memory://`` keeps its queues in process-global state, so messages published through one
``Connection`` are consumed through the one ``BrokerConsumer.run()`` opens. No broker needed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import override_settings
from effects.models import Effect
from kombu import Connection, Queue

from django_inbox.broker.connection import AckMode, BrokerConsumer, ConsumeStats
from django_inbox.models import InboxMessage

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
BROKER = "memory://"


@pytest.fixture
def queue() -> Iterator[str]:
    name = "loop-" + uuid.uuid4().hex
    yield name
    with Connection(BROKER) as connection:
        Queue(name, routing_key=name)(connection.default_channel).delete()


def publish(
    queue: str, body: Any, *, content_type: str = "application/json", **options: Any
) -> None:
    if not isinstance(body, bytes):
        body = json.dumps(body).encode("utf-8")
    declared = Queue(queue, routing_key=queue, durable=True)
    with Connection(BROKER) as connection:
        connection.Producer().publish(
            body,
            routing_key=queue,
            declare=[declared],
            content_type=content_type,
            content_encoding="utf-8",
            **options,
        )


def left_in(queue: str) -> int:
    with Connection(BROKER) as connection:
        bound = Queue(queue, routing_key=queue, durable=True)(connection.default_channel)
        return int(bound.queue_declare(passive=True).message_count)


def consume(queue: str, **options: Any) -> ConsumeStats:
    consumer = BrokerConsumer(
        consumer="effects", queue=queue, broker_url=BROKER, until_idle=0.5, **options
    )
    return consumer.run()


def test_a_message_without_an_id_is_refused_and_not_stored(queue: str) -> None:
    publish(queue, {"type": "effect.write", "n": 1}, type="effect.write")

    stats = consume(queue)

    assert (stats.refused, stats.acked, InboxMessage.objects.count(), left_in(queue)) == (
        1,
        0,
        0,
        0,
    )


def test_an_undecodable_body_is_stored_dead_with_the_raw_body(queue: str) -> None:
    publish(queue, b"<effect/>", content_type="application/xml", message_id="m-xml",
            type="effect.write")  # fmt: skip

    stats = consume(queue)

    row = InboxMessage.objects.get(consumer="effects", message_id="m-xml")
    assert (stats.acked, stats.outcomes["dead"], row.status, row.payload) == (
        1,
        1,
        Status.DEAD,
        {"raw": "<effect/>", "raw_encoding": "utf-8", "content_type": "application/xml",
         "bytes": 9},
    )  # fmt: skip
    assert Effect.objects.count() == 0


def test_after_store_mode_stores_received_rows_without_running_handlers(queue: str) -> None:
    for n in range(3):
        publish(queue, {"n": n}, message_id=f"m-{n}", type="effect.write")

    stats = consume(queue, ack_mode=AckMode.AFTER_STORE)

    statuses = set(InboxMessage.objects.filter(consumer="effects").values_list("status", flat=True))
    assert (stats.acked, stats.outcomes["stored"], statuses, Effect.objects.count()) == (
        3,
        3,
        {Status.RECEIVED},
        0,
    )


def test_a_duplicate_is_acked_as_a_duplicate_and_handled_once(queue: str) -> None:
    for _ in range(2):
        publish(queue, {"n": 1}, message_id="m-dup", type="effect.write")

    stats = consume(queue)

    row = InboxMessage.objects.get(consumer="effects", message_id="m-dup")
    assert (stats.acked, stats.outcomes["processed"], stats.outcomes["duplicate"]) == (2, 1, 1)
    assert (row.status, Effect.objects.filter(message_id="m-dup").count()) == (Status.COMPLETED, 1)
    assert left_in(queue) == 0


def test_an_infinite_header_does_not_kill_a_valid_message(queue: str) -> None:
    publish(queue, {"n": 1}, message_id="m-inf", type="effect.write",
            headers={"ratio": float("inf")})  # fmt: skip

    consume(queue)

    row = InboxMessage.objects.get(consumer="effects", message_id="m-inf")
    assert (row.status, row.payload) == (Status.COMPLETED, {"n": 1})


def test_an_overflowing_number_is_kept_dead_with_the_raw_body(queue: str) -> None:
    body = b'{"n": 1e999}'
    publish(queue, body, message_id="m-big", type="effect.write")

    consume(queue)

    row = InboxMessage.objects.get(consumer="effects", message_id="m-big")
    assert (row.status, row.payload.get("raw")) == (Status.DEAD, body.decode())


def test_a_custom_envelope_reads_ids_from_where_the_producer_put_them(queue: str) -> None:
    publish(queue, {"n": 1}, headers={"X-Event-Id": "legacy-1", "X-Event-Name": "effect.write"})

    with override_settings(INBOX_ENVELOPE="effects.envelopes.from_legacy_headers"):
        stats = consume(queue)

    assert stats.outcomes == {"processed": 1}
    assert InboxMessage.objects.get().message_id == "legacy-1"


def test_an_envelope_setting_that_does_not_import_is_a_check_error() -> None:
    from django.core.checks import run_checks

    with override_settings(INBOX_ENVELOPE="effects.envelopes.missing"):
        assert "django_inbox.E013" in {message.id for message in run_checks()}


def test_unknown_event_type_is_refused_at_the_broker_when_configured(queue: str) -> None:
    publish(queue, {"n": 1}, message_id="m-1", type="nobody.handles.this")

    with override_settings(INBOX_UNHANDLED="refuse"):
        stats = consume(queue, commit_every=10)

    assert stats.refused == 1
    assert not InboxMessage.objects.exists()


def test_until_idle_zero_drains_what_is_waiting_then_stops(queue: str) -> None:
    for n in range(3):
        publish(queue, {"n": n}, message_id=f"m-{n}", type="effect.write")

    stats = BrokerConsumer(consumer="effects", queue=queue, broker_url=BROKER, until_idle=0).run()

    assert stats.outcomes == {"processed": 3}


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("amqp://guest:guest@127.0.0.1:5672//", 60),
        ("amqps://broker.example:5671//", 60),
        ("pyamqp://127.0.0.1//", 60),
        ("amqp://127.0.0.1//?heartbeat=10", None),  # the URL's own
        ("redis://127.0.0.1:6379/0", None),
        ("sqs://", None),
    ],
)
def test_amqp_connections_ask_for_the_heartbeat_setting(url: str, expected: int | None) -> None:
    from django_inbox.broker.transports.kombu import _heartbeat

    with override_settings(INBOX_BROKER_HEARTBEAT="1m"):
        assert _heartbeat(url) == ({} if expected is None else {"heartbeat": expected})
    with override_settings(INBOX_BROKER_HEARTBEAT=0):
        assert _heartbeat(url) == {}


def test_no_heartbeat_unless_set() -> None:
    from django_inbox.broker.transports.kombu import _heartbeat
    from django_inbox.conf import DEFAULTS

    assert DEFAULTS["INBOX_BROKER_HEARTBEAT"] == 0
    with override_settings(INBOX_BROKER_HEARTBEAT=None):
        assert _heartbeat("amqp://127.0.0.1//") == {}
