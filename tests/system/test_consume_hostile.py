"""``inbox_consume`` against hostile broker messages and a new user's mistakes.

Real RabbitMQ and Redis, real ``inbox_consume`` processes. A message with an id is never
requeued for ever: it is stored (``dead`` with its raw body and the reason when it cannot be
read) and acknowledged. Mistakes in the command line end at once with exit 2 and a sentence.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from kombu import Queue

from django_inbox.models import InboxMessage
from tests import brokers

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
Status = InboxMessage.Status


@pytest.fixture(params=["rabbitmq", "redis"])
def broker(request: pytest.FixtureRequest) -> str:
    return brokers.BROKERS[request.param]


@pytest.fixture
def queue(broker: str) -> Iterator[str]:
    name = brokers.new_queue_name("hostile")
    yield name
    brokers.delete_queue(broker, name)


def consume(manage: Manage, broker: str, queue: str, *args: str) -> subprocess.Popen[str]:
    env = {"INBOX_BROKER_TRANSPORT_OPTIONS": json.dumps(brokers.options_for(broker))}
    return manage(
        "inbox_consume", "--consumer", "stream", "--queue", queue, "--broker", broker, *args,
        env=env,
    )  # fmt: skip


def test_messages_no_codec_or_column_can_take_are_stored_dead_and_acked(
    manage: Manage, broker: str, queue: str
) -> None:
    brokers.publish(
        broker,
        queue,
        [
            {"id": "enc-undefined", "type": "effect.write", "body": b'{"n": 1}',
             "content_encoding": "undefined"},
            {"id": "enc-unknown", "type": "effect.write", "body": b'{"n": 2}',
             "content_encoding": "no-such-codec"},
            {"id": "nul-type", "type": "effect.\x00write", "body": {"n": 3}},
            {"id": "nul-source", "type": "effect.write", "body": {"n": 4},
             "headers": {"ce-source": "orders\x00", "ce-partitionkey": "k\x00"}},
            {"id": "nul-header", "type": "effect.write", "body": {"n": 5},
             "headers": {"x-note": "a\x00b"}},
            {"id": "fine", "type": "effect.write", "body": {"n": 6}},
        ],
    )  # fmt: skip

    proc = consume(manage, broker, queue, "--until-idle", "2")
    _out, err = proc.communicate(timeout=120)

    assert proc.returncode == 0, err[-3000:]
    assert brokers.queue_depth(broker, queue) == 0, "every message was acknowledged"
    rows = {row.message_id: row for row in InboxMessage.objects.filter(consumer="stream")}
    assert set(rows) == {
        "enc-undefined", "enc-unknown", "nul-type", "nul-source", "nul-header", "fine"
    }  # fmt: skip
    for name in ("enc-undefined", "enc-unknown"):
        assert rows[name].status == Status.DEAD
        assert "is not valid" in rows[name].last_error and "text" in rows[name].last_error
        assert rows[name].payload["raw"], "the raw body is kept for an operator"
    assert rows["nul-type"].status == Status.DEAD
    assert rows["nul-type"].event_type == "effect.\\x00write"
    assert "NUL" in rows["nul-type"].last_error
    assert rows["nul-source"].status == Status.DEAD
    assert "\\x00" in rows["nul-source"].source
    # A NUL inside a header's value: the message itself is fine; its headers are cleaned.
    assert rows["nul-header"].status == Status.COMPLETED
    assert rows["nul-header"].headers["x-note"] == "a\\x00b"
    assert rows["fine"].status == Status.COMPLETED
    assert "requeue" not in err


def test_a_row_whose_error_cannot_be_stored_does_not_kill_the_consumer(
    manage: Manage, broker: str, queue: str
) -> None:
    from django_inbox import store

    # A due row whose handler raises text with a NUL: the start-up sweep runs it first.
    store(consumer="stream", message_id="due-1", event_type="effect.write",
          payload={"fail_text": "quoted <NUL> payload"})  # fmt: skip
    brokers.publish(broker, queue, [{"id": "m-1", "type": "effect.write", "body": {"n": 1}}])

    proc = consume(manage, broker, queue, "--until-idle", "2")
    _out, err = proc.communicate(timeout=120)

    assert proc.returncode == 0, err[-3000:]
    due = InboxMessage.objects.get(message_id="due-1")
    assert due.status in (Status.FAILED, Status.DEAD)  # retried while the consumer ran
    assert due.errors and all("quoted \\x00 payload" in e["message"] for e in due.errors)
    assert InboxMessage.objects.get(message_id="m-1").status == Status.COMPLETED


def test_keys_longer_than_the_column_are_never_cut_into_one(
    manage: Manage, broker: str, queue: str
) -> None:
    """Two aggregates whose keys share their first 255 characters stay two: each message is
    kept ``dead`` with the reason, neither is applied under the other's key nor skipped."""
    prefix = "CASE-" + "x" * 250
    first, second = prefix + "-first", prefix + "-second"
    brokers.publish(
        broker,
        queue,
        [
            {"id": "long-1", "type": "ordered.apply", "body": {},
             "headers": {"partition_key": first, "sequence": 1}},
            {"id": "long-2", "type": "ordered.apply", "body": {},
             "headers": {"partition_key": second, "sequence": 1}},
            {"id": "long-source", "type": "ordered.apply", "body": {},
             "headers": {"ce-source": "s" * 256, "partition_key": "short", "sequence": 1}},
        ],
    )  # fmt: skip
    env = {"INBOX_BROKER_TRANSPORT_OPTIONS": json.dumps(brokers.options_for(broker))}
    proc = manage(
        "inbox_consume", "--consumer", "ordered", "--queue", queue, "--broker", broker,
        "--until-idle", "2", env=env,
    )  # fmt: skip
    _out, err = proc.communicate(timeout=120)

    assert proc.returncode == 0, err[-3000:]
    assert brokers.queue_depth(broker, queue) == 0
    rows = {row.message_id: row for row in InboxMessage.objects.filter(consumer="ordered")}
    for message_id, length in (("long-1", 261), ("long-2", 262)):
        row = rows[message_id]
        assert row.status == Status.DEAD
        assert row.last_error == f"KeyLost: key is {length} characters long; the limit is 255"
        assert row.key == "", "never a cut key: it could be another aggregate's"
        assert row.headers["partition_key"] in (first, second), "what arrived is kept"
    assert rows["long-source"].status == Status.DEAD
    assert rows["long-source"].source == ""
    assert "source is 256 characters long" in rows["long-source"].last_error
    from effects.models import OrderedRun

    assert not OrderedRun.objects.exists(), "no handler ran under a merged key"


# --- a new user's mistakes ---------------------------------------------------------------


def test_before_migrate_it_exits_2_saying_run_migrate(manage: Manage, db_url: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("CREATE DATABASE inbox_unmigrated_test")
    try:
        unmigrated = db_url.rsplit("/", 1)[0] + "/inbox_unmigrated_test"
        started = time.monotonic()
        proc = manage(
            "inbox_consume", "--consumer", "stream", "--queue", "q", "--broker",
            brokers.RABBITMQ, env={"DATABASE_URL": unmigrated},
        )  # fmt: skip
        _, err = proc.communicate(timeout=60)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP DATABASE IF EXISTS inbox_unmigrated_test")

    assert proc.returncode == 2, err
    assert "migrate" in err
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("rabbitmq://guest:guest@127.0.0.1:5672//", "unknown broker URL scheme 'rabbitmq'"),
        ("no-scheme-at-all", "the broker URL has no scheme"),
    ],
)
def test_an_unknown_broker_scheme_is_one_line_and_exit_2(
    manage: Manage, url: str, says: str
) -> None:
    proc = manage("inbox_consume", "--consumer", "stream", "--queue", "q", "--broker", url)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert says in err
    assert "Traceback" not in err


def test_a_broker_never_reached_gives_up_with_exit_2(manage: Manage) -> None:
    started = time.monotonic()
    proc = manage(
        "inbox_consume", "--consumer", "stream", "--queue", "q",
        "--broker", "amqp://guest:secret-pw@127.0.0.1:1//", "--wait-for-broker", "3s",
        "--until-idle", "1",
    )  # fmt: skip
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert "could not reach the broker" in err
    assert "secret-pw" not in err
    assert time.monotonic() - started < 30


def test_queue_is_required_and_the_start_line_says_what_was_declared(
    manage: Manage, broker: str, queue: str
) -> None:
    missing = manage("inbox_consume", "--consumer", "stream", "--broker", broker)
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 2
    assert "--queue" in err

    brokers.publish(broker, queue, [{"id": "v-1", "type": "effect.write", "body": {"n": 1}}])
    proc = consume(manage, broker, queue, "--until-idle", "1", "-v", "2")
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 0, err
    first = err.splitlines()[0]
    assert f"queue {queue!r}" in first and "consumer 'stream'" in first, first
    assert "declared" in first and "ack after-process" in first and "prefetch" in first
    if "guest:" in broker:
        assert ":guest@" not in first, "never the password"
    per_message = [line for line in out.splitlines() if line.startswith("v-1 ")]
    assert len(per_message) == 1 and "processed" in per_message[0] and "ms" in per_message[0]
    assert "{" not in per_message[0], "never the payload"


@dataclass
class DeadLettered:
    """A RabbitMQ queue whose refused messages go to ``dead_letters``, both new."""

    name: str
    dead_letters: str

    @property
    def arguments(self) -> dict[str, str]:
        return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": self.dead_letters}


@pytest.fixture
def amqp_queue() -> Iterator[DeadLettered]:
    with brokers.declared_queue("hostile-dlq") as dead_letters:
        queue = DeadLettered(brokers.new_queue_name("hostile-amqp"), dead_letters)
        with brokers.connect(brokers.RABBITMQ) as connection:
            Queue(queue.name, durable=True, queue_arguments=queue.arguments)(
                connection.default_channel
            ).declare()
        yield queue
        brokers.delete_queue(brokers.RABBITMQ, queue.name)


def consume_declared(manage: Manage, queue: DeadLettered) -> tuple[str, str]:
    proc = manage(
        "inbox_consume", "--consumer", "stream", "--queue", queue.name, "--no-declare",
        "--broker", brokers.RABBITMQ, "--until-idle", "2",
    )  # fmt: skip
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "reconnects 0" in out
    return out, err


def test_amqp_headers_nested_past_python_are_refused_never_a_loop(
    manage: Manage, amqp_queue: DeadLettered
) -> None:
    """py-amqp decodes header tables recursively, before any callback: a table nested a few
    thousand levels deep broke its frame reader, the connection dropped and the broker
    redelivered the message to the next one, for ever (or the consumer exited). It is
    refused now, to the dead-letter queue: its id went with its properties, and the body's
    ``id`` (an order's, say) is not the message's."""
    deep: dict[str, object] = {"x": 1}
    for _ in range(3000):
        deep = {"x": deep}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # py-amqp encodes recursively too (pure Python)
    try:
        brokers.publish(
            brokers.RABBITMQ,
            amqp_queue.name,
            [
                {"id": "deep-1", "type": "effect.write", "body": {"id": "order-42"},
                 "headers": {"deep": deep}},
                {"id": "deep-2", "type": "effect.write", "body": {"id": "order-42"},
                 "headers": {"deep": deep}},
                {"id": "fine", "type": "effect.write", "body": {"n": 2}},
            ],
            **amqp_queue.arguments,
        )  # fmt: skip
    finally:
        sys.setrecursionlimit(limit)

    out, err = consume_declared(manage, amqp_queue)

    assert "refused 2" in out and "acked 1" in out
    assert err.count("arrived without its properties") == 2
    assert brokers.queue_depth(brokers.RABBITMQ, amqp_queue.name) == 0
    assert brokers.queue_depth(brokers.RABBITMQ, amqp_queue.dead_letters) == 2, "nothing lost"
    statuses = dict(InboxMessage.objects.values_list("message_id", "status"))
    assert statuses == {"fine": Status.COMPLETED}, "never kept under the body's id"


# --- what the transport cannot read, before the inbox sees a message -------------------------


def test_redis_list_entries_that_are_not_kombu_messages_never_stop_the_consumer(
    manage: Manage,
) -> None:
    """kombu's Redis transport pops an entry, then decodes its envelope inside drain_events:
    an entry that is not one (raw text, a JSON list, nesting past Python's recursion) raised
    out of it and ended inbox_consume (exit 1) on each. They are logged and counted now; the
    entry itself was already taken by kombu (a limit of its Redis lists, see the docs)."""
    import redis

    broker = brokers.REDIS
    queue = brokers.new_queue_name("hostile-raw")
    client = redis.Redis.from_url(broker)
    try:
        brokers.publish(broker, queue, [{"id": "before", "type": "effect.write", "body": {}}])
        for raw in ("not json at all", "[1, 2, 3]", "[" * 100_000 + "]" * 100_000):
            client.lpush(queue, raw)
        brokers.publish(broker, queue, [{"id": "after", "type": "effect.write", "body": {}}])

        proc = consume(manage, broker, queue, "--until-idle", "2")
        out, err = proc.communicate(timeout=120)
    finally:
        brokers.delete_queue(broker, queue)

    assert proc.returncode == 0, err[-3000:]
    assert "unreadable 3" in out and "reconnects 0" in out
    assert err.count("could not read an entry of queue") == 3
    statuses = dict(InboxMessage.objects.values_list("message_id", "status"))
    assert statuses == {"before": Status.COMPLETED, "after": Status.COMPLETED}


@pytest.mark.parametrize("broker", list(brokers.BROKERS.values()), ids=list(brokers.BROKERS))
def test_a_compression_kombu_cannot_apply_is_kept_dead_not_a_crash_loop(
    manage: Manage, broker: str
) -> None:
    queue = brokers.new_queue_name("hostile-compression")
    try:
        brokers.publish(
            broker,
            queue,
            [
                {"id": "compressed-none", "type": "effect.write", "body": {"n": 1},
                 "headers": {"compression": "none"}},
                {"id": "compressed-gzip", "type": "effect.write", "body": {"n": 2},
                 "headers": {"compression": "application/x-gzip"}},
                {"id": "fine", "type": "effect.write", "body": {"n": 3}},
            ],
        )  # fmt: skip
        for run in range(2):  # the first run ended with exit 1, and so did every next one
            proc = consume(manage, broker, queue, "--until-idle", "2")
            _out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, (run, err[-3000:])
        assert brokers.queue_depth(broker, queue) == 0
    finally:
        brokers.delete_queue(broker, queue)
    rows = {row.message_id: row for row in InboxMessage.objects.filter(consumer="stream")}
    for name in ("compressed-none", "compressed-gzip"):
        assert rows[name].status == Status.DEAD
        assert rows[name].last_error.startswith("Unreadable: the message could not be read")
        assert rows[name].payload["raw"], "the raw body is kept"
    assert rows["fine"].status == Status.COMPLETED


def _raw_properties(**fields: bytes) -> bytes:
    """AMQP basic properties as a sender may write them, undecodable ones included."""
    names = ["content_type", "content_encoding", "application_headers", "delivery_mode",
             "priority", "correlation_id", "reply_to", "expiration", "message_id", "timestamp",
             "type"]  # fmt: skip
    flags, out = 0, b""
    for index, name in enumerate(names):
        if name in fields:
            flags |= 1 << (15 - index)
            out += fields[name]
    return struct.pack(">H", flags) + out


def _shortstr(value: bytes) -> bytes:
    return struct.pack("B", len(value)) + value


def test_amqp_properties_that_cannot_be_decoded_are_refused_never_a_crash_loop(
    manage: Manage, amqp_queue: DeadLettered
) -> None:
    """A timestamp header sent in milliseconds (a year past 9999) or a property that is not
    UTF-8 failed py-amqp's decoding half-way through the message: a crash loop before. The
    messages go to the dead-letter queue, the one behind them is processed."""
    import amqp
    from amqp.basic_message import Message

    class Raw(Message):  # type: ignore[misc]
        __slots__ = ("raw",)

        def _serialize_properties(self) -> bytes:
            return self.raw

    entry = _shortstr(b"sent_at") + b"T" + struct.pack(">Q", 1732680000000)
    millis = struct.pack(">I", len(entry)) + entry
    cases = {
        b'{"id": "order-42", "type": "effect.write"}': _raw_properties(
            content_type=_shortstr(b"application/json"),
            application_headers=millis,
            message_id=_shortstr(b"millis"),
        ),
        b'{"id": "order-42", "n": 2}': _raw_properties(
            message_id=_shortstr(b"rt-\xff\xfe"),
        ),
        b'{"type": "effect.write"}': _raw_properties(type=_shortstr(b"effect.\xff")),
    }
    connection = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    connection.connect()
    try:
        channel = connection.channel()
        for body, properties in cases.items():
            message = Raw(body)
            message.raw = properties
            channel.basic_publish(message, exchange="", routing_key=amqp_queue.name)
    finally:
        connection.close()
    brokers.publish(
        brokers.RABBITMQ,
        amqp_queue.name,
        [{"id": "fine", "type": "effect.write", "body": {}}],
        **amqp_queue.arguments,
    )

    out, _err = consume_declared(manage, amqp_queue)

    assert "refused 3" in out and "acked 1" in out
    assert brokers.queue_depth(brokers.RABBITMQ, amqp_queue.name) == 0
    assert brokers.queue_depth(brokers.RABBITMQ, amqp_queue.dead_letters) == 3, "nothing lost"
    statuses = dict(InboxMessage.objects.values_list("message_id", "status"))
    assert statuses == {"fine": Status.COMPLETED}


def test_a_routing_key_that_is_not_utf8_neither_stalls_nor_loops(manage: Manage) -> None:
    """py-amqp failed on such a delivery before the message existed: it was never settled,
    held the only prefetch slot, and the message behind it never came."""
    import amqp

    with brokers.declared_queue("hostile-rk") as queue:
        exchange = f"{queue}-fanout"
        connection = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
        connection.connect()
        try:
            channel = connection.channel()
            channel.exchange_declare(exchange, "fanout", durable=False, auto_delete=False)
            channel.queue_bind(queue, exchange, routing_key="")
            odd = amqp.Message(b"{}", message_id="odd-key", type="effect.write")
            channel.basic_publish(odd, exchange=exchange, routing_key=b"\xff\xfe")
            channel.basic_publish(
                amqp.Message(b"{}", message_id="behind", type="effect.write"),
                exchange="",
                routing_key=queue,
            )
            proc = manage(
                "inbox_consume", "--consumer", "stream", "--queue", queue,
                "--broker", brokers.RABBITMQ, "--until-idle", "2", "--prefetch", "1",
            )  # fmt: skip
            out, err = proc.communicate(timeout=120)
        finally:
            connection.channel().exchange_delete(exchange)
            connection.close()
        assert brokers.queue_depth(brokers.RABBITMQ, queue) == 0

    assert proc.returncode == 0, err[-3000:]
    assert "acked 2 (processed 2)" in out and "reconnects 0" in out
    statuses = dict(InboxMessage.objects.values_list("message_id", "status"))
    assert statuses == {"odd-key": Status.COMPLETED, "behind": Status.COMPLETED}


@pytest.mark.django_db(transaction=True)
def test_a_broker_lost_while_acking_the_open_batch_is_the_loops_not_the_next_messages() -> None:
    """Acknowledging the open batch happens inside the next message's decision: a broker lost
    there was taken for that message's failure, and the message was kept dead (then answered
    as dead when the broker delivered it again)."""
    from kombu import Connection, Consumer

    from django_inbox.broker.acking import Acker
    from django_inbox.broker.envelope import parse
    from django_inbox.broker.intake import AckMode, Intake
    from django_inbox.processing.shutdown import Shutdown

    with brokers.declared_queue("ack-lost") as queue:
        brokers.publish(
            brokers.RABBITMQ,
            queue,
            [
                {"id": "in-the-batch", "type": "effect.write", "body": {}},
                {"id": "next", "type": "no.handler", "body": {}},  # not batched: flushes first
            ],
        )
        connection = Connection(brokers.RABBITMQ)
        received: list[Any] = []
        consumer = Consumer(
            connection.channel(), [Queue(queue, routing_key=queue, durable=True)],
            on_message=received.append, prefetch_count=10,
        )  # fmt: skip
        consumer.consume()
        while len(received) < 2:
            connection.drain_events(timeout=10)
        intake = Intake(
            consumer="stream", queue_name=queue, ack_mode=AckMode.AFTER_PROCESS, batching=True,
            envelope=parse, raw_limit=1024,
        )  # fmt: skip
        acker = Acker(intake, using="default", commit_every=100, shutdown=Shutdown())
        acker.broken = (*connection.connection_errors, *connection.channel_errors)
        acker.take(received[0])
        assert acker.pending, "held in the open batch"
        connection.connection.transport.sock.close()  # the broker goes away

        with pytest.raises(acker.broken):
            acker.take(received[1])
        connection.release()

    statuses = dict(InboxMessage.objects.values_list("message_id", "status"))
    assert statuses == {"in-the-batch": Status.COMPLETED}, "the next message is not kept dead"
