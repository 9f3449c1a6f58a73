"""Stored rows no process can read: real ``inbox_process`` and ``outbox_relay`` processes.

A payload nested deeper than Python decodes (stored by an earlier release, by another Python,
or by hand) made every worker that claimed it exit with ``RecursionError``; the claim rolled
back, the row stayed first in line, and the consumer's other rows waited for ever. The same
row in the outbox stopped every relay. Now each such row ends ``dead`` with its reason, and
the rows around it are processed.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator

import pytest
from django.db import connection
from kombu import Connection

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.outbox import publish
from django_inbox.outbox.models import OutboxMessage
from tests import brokers
from tests.effects import effect_counts

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
Status = InboxMessage.Status

#: Deeper than any Python decodes from any stack (PostgreSQL's jsonb still stores it).
DEPTH = 3000


def make_deep(table: str, column: str, pk: int) -> None:
    """Store a value ``DEPTH`` arrays deep in ``column`` of row ``pk``, bypassing the inbox's
    own validation, as an earlier release or a hand-made row would."""
    value = "[" * DEPTH + "1" + "]" * DEPTH
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s::jsonb WHERE id = %s", [value, pk])


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}: {err[-3000:]}"
    assert "RecursionError" not in err
    return out


@pytest.mark.parametrize("column", ["payload", "headers"])
def test_a_worker_records_an_unreadable_row_dead_and_processes_the_rest(
    manage: Manage, column: str
) -> None:
    for n in range(5):
        store(consumer="effects", message_id=f"m-{n}", event_type="effect.write", payload={})
    deep = InboxMessage.objects.get(consumer="effects", message_id="m-0")
    make_deep(InboxMessage._meta.db_table, column, deep.pk)

    out = finish(manage("inbox_process", "--consumer", "effects", "--until-idle", "1"))

    deep.refresh_from_db(fields=["status", "attempts", "last_error"])
    assert deep.status == Status.DEAD
    assert deep.attempts == 1
    assert deep.last_error.startswith(f"UnreadableMessage: the stored {column} is nested deeper")
    assert "the handler did not run" in deep.last_error
    assert effect_counts() == {f"m-{n}": 1 for n in range(1, 5)}, "the others ran, once each"
    assert "dead 1" in out
    with connection.cursor() as cursor:  # the stored value is kept as it was
        cursor.execute(
            f"SELECT length({column}::text) FROM {InboxMessage._meta.db_table} WHERE id = %s",
            [deep.pk],
        )
        assert cursor.fetchone()[0] == 2 * DEPTH + 1


@pytest.fixture
def queue() -> Iterator[str]:
    with brokers.declared_queue("unreadable") as name:
        yield name


@pytest.mark.parametrize("column", ["payload", "headers"])
def test_a_relay_records_an_unreadable_row_dead_and_publishes_the_rest(
    manage: Manage, queue: str, column: str
) -> None:
    first = publish("deep.event", {"n": 0}, routing_key=queue, key="k")
    later = [publish("deep.event", {"n": n}, routing_key=queue, key="k") for n in (1, 2)]
    other = publish("deep.event", {"n": 3}, routing_key=queue)
    deep = OutboxMessage.objects.get(message_id=first)
    make_deep(OutboxMessage._meta.db_table, column, deep.pk)

    finish(manage("outbox_relay", "--broker", brokers.RABBITMQ, "--until-idle", "1"))

    deep.refresh_from_db()
    assert deep.status == OutboxMessage.Status.DEAD
    assert f"the stored {column} is nested deeper" in deep.last_error
    sent = set(
        OutboxMessage.objects.filter(status=OutboxMessage.Status.SENT).values_list(
            "message_id", flat=True
        )
    )
    assert sent == {*later, other}, "the key's later rows and the others went out"
    with Connection(brokers.RABBITMQ) as broker:
        bodies = []
        while (message := broker.default_channel.basic_get(queue, no_ack=True)) is not None:
            bodies.append(json.loads(message.body))
    assert sorted(body["n"] for body in bodies) == [1, 2, 3]


# --- rows written by hand or by another program ---------------------------------------------

#: SQL ``SET`` clauses a hand-made row may hold, and what its handler's run must end in.
HAND_MADE = {
    "history-null": ("history = 'null'", Status.COMPLETED),
    "history-number": ("history = '5'", Status.COMPLETED),
    "history-text": ("history = '\"abc\"'", Status.COMPLETED),
    "history-not-entries": (
        'history = \'[1, null, {"kind": ["a"]}, {"at": 5}]\'',
        Status.COMPLETED,
    ),
    "history-deep": (f"history = '{'[' * DEPTH}{']' * DEPTH}'", Status.COMPLETED),
    "payload-5000-digits": (f"payload = '{{\"a\": {'9' * 5000}}}'", Status.DEAD),
    "attempts-at-the-column-max": ("attempts = 2147483647", Status.COMPLETED),
}


@pytest.mark.parametrize("case", list(HAND_MADE))
def test_rows_written_by_hand_never_stop_a_worker(manage: Manage, case: str) -> None:
    """Each made every inbox_process exit at its claim or its failure (a DataError past the
    attempts column, a TypeError appending to a history that is no list, a ValueError
    decoding 5,000 digits), the row stayed first in line and the consumer's other rows waited
    for ever. A failing handler is the harder case: its failure appends to the history."""
    change, ends = HAND_MADE[case]
    for message_id in ("hand-made", "behind"):
        store(consumer="effects", message_id=message_id, event_type="effect.write", payload={})
    failing = InboxMessage.objects.get(message_id="hand-made")
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {change} WHERE id = %s", [failing.pk])

    finish(manage("inbox_process", "--consumer", "effects", "--until-idle", "1"))

    row = InboxMessage.objects.get(pk=failing.pk)
    assert row.status == ends, row.last_error
    assert InboxMessage.objects.get(message_id="behind").status == Status.COMPLETED
    assert all(isinstance(entry, dict) and "kind" in entry for entry in row.history)


@pytest.mark.parametrize("change", ["history = 'null'", "history = '[1, \"x\"]'"])
def test_a_failing_handler_records_its_failure_whatever_the_history_held(
    manage: Manage, change: str
) -> None:
    store(
        consumer="effects", message_id="fails", event_type="effect.write",
        payload={"fail_always": True},
    )  # fmt: skip
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {change} WHERE message_id = 'fails'")

    finish(manage("inbox_process", "--consumer", "effects", "--until-idle", "1"))

    row = InboxMessage.objects.get(message_id="fails")
    assert row.status in (Status.FAILED, Status.DEAD)
    assert row.errors, "the failure is in the history"
    if change != "history = 'null'":
        assert row.history[0]["kind"] == "unreadable", "what the row held is kept as text"


OUTBOX_HAND_MADE = {
    # A 32-bit attempts column: the claim's attempts + 1 failed in the database, every claim.
    "attempts-at-the-column-max": ("attempts = 2147483647", "claimed 2147483647 times"),
    # py-amqp cannot even ask the broker about an exchange name over 255 bytes (struct.error).
    "exchange-over-255-bytes": (f"exchange = '{'é' * 200}'", "over 255 bytes of UTF-8"),
    # Claimed past INBOX_OUTBOX_MAX_ATTEMPTS (10) without settling: each claim stopped a relay.
    "claimed-past-its-attempts": ("attempts = 10", "claimed 11 times"),
}


@pytest.mark.parametrize("case", list(OUTBOX_HAND_MADE))
def test_outbox_rows_written_by_hand_never_stop_a_relay(
    manage: Manage, queue: str, case: str
) -> None:
    change, says = OUTBOX_HAND_MADE[case]
    odd = publish("odd.event", {"n": 0}, routing_key=queue)
    behind = [publish("odd.event", {"n": n}, routing_key=queue) for n in (1, 2)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {OutboxMessage._meta.db_table} SET {change} WHERE message_id = %s", [odd]
        )

    finish(manage("outbox_relay", "--broker", brokers.RABBITMQ, "--until-idle", "1"))

    row = OutboxMessage.objects.get(message_id=odd)
    assert row.status == OutboxMessage.Status.DEAD
    assert says in row.last_error
    sent = OutboxMessage.objects.filter(status=OutboxMessage.Status.SENT)
    assert set(sent.values_list("message_id", flat=True)) == set(behind)
