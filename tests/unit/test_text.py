"""What a careless handler or a hostile sender gives the inbox to store.

A handler's error text with a NUL or a lone surrogate, an exception whose ``__str__`` raises,
a message for a consumer nobody handles: each ends in a visible state with a reason (or a
``ValueError`` and no row), never in an exception out of ``deliver()``, a crashed worker or a
row stuck ``in_progress``. Runs on SQLite and PostgreSQL (PostgreSQL refuses NUL in text).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from effects.models import Effect

from django_inbox import InvalidMessage, Outcome, deliver, store, store_dead
from django_inbox.exceptions import UnknownConsumer
from django_inbox.intake.storing import KEY_LOST
from django_inbox.models import InboxMessage
from django_inbox.processing.worker import Worker
from django_inbox.text import storable, storable_json
from tests.conftest import handler

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status

NUL_TEXT = "card declined\x00 by the bank"
SURROGATE_TEXT = "broken \ud800 text"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ itself fails")


def raising(exc: BaseException) -> Any:
    def handle(message: InboxMessage) -> None:
        Effect.objects.create(consumer="hostile", message_id=message.message_id, attempt=1, pid=0)
        raise exc

    return handle


def send(message_id: str = "h-1") -> Outcome:
    return deliver(consumer="hostile", message_id=message_id, event_type="boom", payload={"a": 1})


# --- the text itself ---------------------------------------------------------------------


def test_storable_replaces_nul_and_lone_surrogates_visibly() -> None:
    assert storable("a\x00b") == "a\\x00b"
    assert storable("x\ud800y") == "x\\ud800y"
    assert storable("plain ✓ text") == "plain ✓ text"
    assert storable(Unprintable()) == "<unprintable Unprintable object>"
    assert storable_json({"k\x00": ["v\ud83d", 1, None]}) == {"k\\x00": ["v\\ud83d", 1, None]}


# --- a handler's error text --------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (RuntimeError(NUL_TEXT), "card declined\\x00 by the bank"),
        (RuntimeError(SURROGATE_TEXT), "broken \\ud800 text"),
        (Unprintable(), "<unprintable Unprintable>"),
        (RuntimeError(b"bytes \x00 quoted"), "bytes \\x00 quoted"),
    ],
    ids=["nul", "surrogate", "unprintable", "bytes-argument"],
)
def test_deliver_records_an_unstorable_handler_error_instead_of_raising(
    exc: Exception, shown: str
) -> None:
    with handler("boom", "hostile", raising(exc), max_attempts=2):
        assert send() is Outcome.FAILED
        row = InboxMessage.objects.get(message_id="h-1")
        assert row.status == Status.FAILED
        assert row.attempts == 1
        assert shown in row.last_error
        assert shown in row.errors[0]["message"]
        assert "\x00" not in row.errors[0]["traceback"] + row.errors[0]["type"]
        assert Effect.objects.count() == 0, "the failed attempt's write is rolled back"

        # The retry on the stored path records its failure the same way, then goes dead.
        InboxMessage.objects.filter(pk=row.pk).update(next_attempt_at=row.received_at)
        stats = Worker(["hostile"], until_idle=0).run()

    assert stats.outcomes == {"dead": 1}
    row.refresh_from_db()
    assert row.status == Status.DEAD
    assert [e["attempt"] for e in row.errors] == [1, 2]
    assert shown in row.errors[1]["message"]


def test_a_worker_records_the_error_and_goes_on_with_the_batch() -> None:
    calls: list[str] = []

    def handle(message: InboxMessage) -> None:
        calls.append(message.message_id)
        if message.message_id == "poison":
            raise RuntimeError("payload quoted: \x00\ud800")

    with handler("boom", "hostile", handle, max_attempts=1):
        for message_id in ("a", "poison", "b"):
            store(consumer="hostile", message_id=message_id, event_type="boom", payload={})
        stats = Worker(["hostile"], until_idle=0).run()

    assert stats.outcomes == {"processed": 2, "dead": 1}
    assert calls == ["a", "poison", "b"]
    poison = InboxMessage.objects.get(message_id="poison")
    assert poison.status == Status.DEAD
    assert "payload quoted: \\x00\\ud800" in poison.last_error
    assert not InboxMessage.objects.filter(status=Status.IN_PROGRESS).exists()


def test_an_operator_reason_with_nul_is_stored_cleaned() -> None:
    from django_inbox.services import park, select

    with handler("boom", "hostile", raising(RuntimeError("x"))):
        store(consumer="hostile", message_id="p", event_type="boom", payload={})
        result = park(select(message_ids=["p"]), actor="op\x00", reason="why\x00\udfff", via="test")

    assert result.total == 1
    entry = InboxMessage.objects.get().history[-1]
    assert (entry["by"], entry["reason"]) == ("op\\x00", "why\\x00\\udfff")


# --- consumers nobody handles ------------------------------------------------------------


@pytest.mark.parametrize("entry", [deliver, store])
def test_a_consumer_without_handlers_is_refused_naming_the_known_ones(entry: Any) -> None:
    with pytest.raises(UnknownConsumer, match=re.escape("'effects'")) as info:
        entry(consumer="invnetory", message_id="m", event_type="order.placed", payload={})

    assert isinstance(info.value, ValueError)
    assert "'invnetory'" in str(info.value)
    assert InboxMessage.objects.count() == 0


# --- store_dead: the last resort keeps the message whatever its fields hold -------------


def test_store_dead_cleans_fields_it_cannot_store() -> None:
    assert store_dead(
        consumer="effects",
        message_id="d-1",
        event_type="type\x00" + "t" * 300,
        source="src\ud800",
        key="k\x00",
        headers={"h\x00": "v\x00", "n": float("nan")},
        payload={"bad": float("inf")},
        reason="reason\x00",
    )

    row = InboxMessage.objects.get()
    assert row.status == Status.DEAD
    assert row.event_type.startswith("type\\x00t") and len(row.event_type) == 255
    # a key that cannot be stored as it is is blanked, never cleaned: "k\x00" and "k" must not
    # become one ordered key; the error type says the key was lost
    assert (row.source, row.key) == ("src\\ud800", "")
    assert row.errors[-1]["type"] == KEY_LOST
    assert "reason\\x00" in row.last_error
    assert "payload" in row.payload.get("refused", "")
    assert row.headers.get("h\\x00") == "v\\x00" or "refused" in row.headers


def test_store_dead_still_refuses_an_unusable_id() -> None:
    with pytest.raises(InvalidMessage):
        store_dead(consumer="effects", message_id="", event_type="x", payload={}, reason="r")
    assert InboxMessage.objects.count() == 0
