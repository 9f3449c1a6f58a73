"""``deliver()`` and ``store()`` refuse bad input with a ``ValueError`` and store nothing."""

from __future__ import annotations

import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from django.test import override_settings

from django_inbox import (
    InvalidField,
    InvalidMessage,
    InvalidMessageId,
    InvalidPayload,
    Outcome,
    PayloadTooLarge,
    UnknownEventType,
    deliver,
    store,
)
from django_inbox.models import InboxMessage

pytestmark = pytest.mark.django_db(transaction=True)

Status = InboxMessage.Status
ENTRY_POINTS = [pytest.param(deliver, id="deliver"), pytest.param(store, id="store")]


def good(**overrides: Any) -> dict[str, Any]:
    """Valid arguments for the testproject's ``effects`` consumer, with ``overrides``."""
    return {
        "consumer": "effects",
        "message_id": "evt-1",
        "event_type": "effect.write",
        "payload": {"n": 1},
        **overrides,
    }


def nested(depth: int) -> Any:
    """A list ``depth`` levels deep, built without recursion."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


BAD_INPUT = [
    pytest.param({"message_id": ""}, InvalidMessageId, id="empty-id"),
    pytest.param({"message_id": "   "}, InvalidMessageId, id="blank-id"),
    pytest.param({"message_id": "x" * 256}, InvalidMessageId, id="256-char-id"),
    pytest.param({"message_id": None}, InvalidMessageId, id="none-id"),
    pytest.param({"message_id": 1.5}, InvalidMessageId, id="float-id"),
    pytest.param({"message_id": "a\x00b"}, InvalidMessageId, id="nul-in-id"),
    pytest.param({"payload": float("nan")}, InvalidPayload, id="nan"),
    pytest.param({"payload": {"amount": float("nan")}}, InvalidPayload, id="nested-nan"),
    pytest.param({"payload": float("inf")}, InvalidPayload, id="infinity"),
    pytest.param({"payload": {"limit": float("-inf")}}, InvalidPayload, id="minus-infinity"),
    pytest.param({"payload": set()}, InvalidPayload, id="set"),
    pytest.param({"payload": {"obj": object()}}, InvalidPayload, id="object"),
    pytest.param({"payload": {"text": "a\x00b"}}, InvalidPayload, id="nul-in-payload"),
    pytest.param({"payload": {"text": "\ud800"}}, InvalidPayload, id="surrogate-in-payload"),
    pytest.param({"headers": ["not", "a", "mapping"]}, InvalidPayload, id="headers-list"),
    pytest.param({"headers": "k=v"}, InvalidPayload, id="headers-str"),
    pytest.param({"headers": {"x": float("nan")}}, InvalidPayload, id="nan-in-headers"),
    pytest.param({"consumer": ""}, InvalidField, id="empty-consumer"),
    pytest.param({"consumer": "c" * 101}, InvalidField, id="101-char-consumer"),
    pytest.param({"event_type": ""}, InvalidField, id="empty-event-type"),
    pytest.param({"event_type": None}, InvalidField, id="none-event-type"),
    pytest.param({"source": "s" * 256}, InvalidField, id="256-char-source"),
    pytest.param({"key": 7}, InvalidField, id="int-key"),
    pytest.param({"payload": nested(65)}, InvalidPayload, id="payload-65-deep"),
    pytest.param({"payload": nested(960)}, InvalidPayload, id="payload-960-deep"),
    pytest.param({"payload": nested(100_000)}, InvalidPayload, id="payload-100000-deep"),
    pytest.param({"headers": {"h": nested(64)}}, InvalidPayload, id="headers-65-deep"),
    pytest.param({"headers": {"h": nested(100_000)}}, InvalidPayload, id="headers-100000-deep"),
    pytest.param({"message_id": 10**5000}, InvalidMessageId, id="5000-digit-int-id"),
    pytest.param({"sequence": 10**5000}, InvalidField, id="5000-digit-sequence"),
    pytest.param({"sequence": "9" * 5000}, InvalidField, id="5000-digit-text-sequence"),
    pytest.param({"sequence": -(10**5000)}, InvalidField, id="minus-5000-digit-sequence"),
]


def count() -> int:
    return InboxMessage.objects.count()


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("overrides", "exc"), BAD_INPUT)
def test_bad_input_raises_and_stores_nothing(
    entry: Callable[..., Any], overrides: dict[str, Any], exc: type[Exception]
) -> None:
    with pytest.raises(exc) as info:
        entry(**good(**overrides))
    assert isinstance(info.value, InvalidMessage)
    assert isinstance(info.value, ValueError)
    assert count() == 0


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_payload_over_the_limit_is_refused(entry: Callable[..., Any]) -> None:
    with override_settings(INBOX_MAX_PAYLOAD_BYTES=64):
        with pytest.raises(PayloadTooLarge, match="allows 64"):
            entry(**good(payload={"blob": "x" * 64}))
        assert count() == 0
        # Headers are held to the same limit.
        with pytest.raises(PayloadTooLarge, match="headers"):
            entry(**good(headers={"h": "y" * 64}))
        assert count() == 0
        # Just under the limit is accepted: the limit, not the test, refused the others.
        entry(**good(payload={"blob": "x" * 40}))
    assert count() == 1


def test_limit_is_read_at_call_time() -> None:
    big = {"blob": "x" * 5000}
    with override_settings(INBOX_MAX_PAYLOAD_BYTES=1000), pytest.raises(PayloadTooLarge):
        store(**good(payload=big))
    assert store(**good(payload=big)) is True  # the default limit is 1 MiB
    assert count() == 1


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_literal_backslash_u0000_is_stored(entry: Callable[..., Any]) -> None:
    entry(**good(payload={"path": "C:\\u0000", "raw": "\\u0000"}))
    row = InboxMessage.objects.get()
    assert row.payload == {"path": "C:\\u0000", "raw": "\\u0000"}


# --- positive controls: the same arguments minus the defect are stored -------------------------


def test_store_valid_message() -> None:
    assert store(**good(headers=MappingProxyType({"ce-id": "1"}), source="orders", key="k1"))
    assert store(**good()) is False  # duplicate
    row = InboxMessage.objects.get()
    assert (row.consumer, row.message_id, row.event_type) == ("effects", "evt-1", "effect.write")
    assert row.status == Status.RECEIVED
    assert row.payload == {"n": 1}
    assert row.headers == {"ce-id": "1"}
    assert (row.source, row.key) == ("orders", "k1")


def test_deliver_valid_message() -> None:
    assert deliver(**good(message_id=42)) is Outcome.PROCESSED
    assert deliver(**good(message_id="42")) is Outcome.DUPLICATE
    row = InboxMessage.objects.get()
    assert row.message_id == "42"
    assert row.status == Status.COMPLETED


def test_255_char_id_is_accepted() -> None:
    assert store(**good(message_id="x" * 255)) is True
    assert InboxMessage.objects.get().message_id == "x" * 255


# --- messages nobody handles ----------------------------------------------------------------


@pytest.mark.parametrize(("consumer", "event_type"), [("effects", "effect.unknown")])
def test_deliver_unhandled_is_stored_dead(consumer: str, event_type: str) -> None:
    outcome = deliver(consumer=consumer, message_id="evt-x", event_type=event_type, payload={})
    assert outcome is Outcome.DEAD
    row = InboxMessage.objects.get()
    assert row.status == Status.DEAD
    assert (row.consumer, row.event_type) == (consumer, event_type)
    assert repr(event_type) in row.last_error
    assert len(row.errors) == 1
    assert repr(event_type) in row.errors[0]["message"]
    assert row.next_attempt_at is None
    # Delivered again: still dead, still one row.
    again = deliver(consumer=consumer, message_id="evt-x", event_type=event_type, payload={})
    assert again is Outcome.DEAD
    assert count() == 1


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_text_in_headers_is_made_storable_not_refused(entry: Callable[..., Any]) -> None:
    # Headers are what a broker or sender added: a NUL or lone surrogate in them is replaced
    # visibly (the payload, the message itself, is refused instead: see above).
    entry(**good(headers={"x\x00": "a\x00b", "y": "\ud800"}))

    assert InboxMessage.objects.get().headers == {"x\\x00": "a\\x00b", "y": "\\ud800"}


def test_store_unhandled_is_stored_dead() -> None:
    assert store(consumer="inventory", message_id="e", event_type="order.lost", payload={}) is True
    assert store(consumer="inventory", message_id="e", event_type="order.lost", payload={}) is False
    row = InboxMessage.objects.get()
    assert row.status == Status.DEAD
    assert "'order.lost'" in row.last_error


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_unhandled_refused_when_configured(entry: Callable[..., Any]) -> None:
    with override_settings(INBOX_UNHANDLED="refuse"):
        with pytest.raises(UnknownEventType, match=re.escape("'effect.unknown'")) as info:
            entry(**good(event_type="effect.unknown"))
        assert isinstance(info.value, ValueError)
        assert count() == 0
        # Handled event types are unaffected by the setting.
        entry(**good())
    assert count() == 1


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_validation_happens_before_the_unhandled_decision(entry: Callable[..., Any]) -> None:
    with pytest.raises(InvalidMessageId):
        entry(**good(event_type="effect.unknown", message_id=""))
    assert count() == 0


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("field", ["message_id", "event_type", "source"])
def test_lone_surrogate_in_text_fields_is_an_invalid_message(
    entry: Callable[..., Any], field: str
) -> None:
    try:
        with pytest.raises(InvalidMessage):
            entry(**good(**{field: "evt-\ud800"}))
    finally:
        assert count() == 0
