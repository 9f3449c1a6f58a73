"""Property-based tests: whatever text, ids, headers and JSON a sender or a handler produces,
the inbox either refuses the message with a clear ``ValueError`` and stores nothing, or keeps
exactly one row in a visible state with a reason. Never another exception, never a row stuck
``in_progress``.

Examples are derandomised so that a run is repeatable; ``INBOX_HYPOTHESIS_EXAMPLES`` runs more
(and ``INBOX_HYPOTHESIS_RANDOM=1`` new ones) when exploring.
"""

from __future__ import annotations

import math
import os
from typing import Any

import pytest
from effects.models import Effect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kombu.message import Message

from django_inbox import InvalidMessage, Outcome, deliver, store
from django_inbox.broker.envelope import parse
from django_inbox.broker.intake import AckMode, Action, Intake
from django_inbox.models import InboxMessage
from tests.conftest import handler

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status

PROFILE = settings(
    max_examples=int(os.environ.get("INBOX_HYPOTHESIS_EXAMPLES", "120")),
    derandomize=os.environ.get("INBOX_HYPOTHESIS_RANDOM") != "1",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

#: Any text: NULs, lone surrogates, control characters, emoji, very long.
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)
SHORT_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | ANY_TEXT,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(SHORT_TEXT, children, max_size=4)
    ),
    max_leaves=12,
)
IDS = st.one_of(
    SHORT_TEXT,
    st.text(max_size=300),
    st.integers(),
    st.none(),
    st.binary(max_size=10),
    st.sampled_from(["", " ", "ok-id", "x" * 256]),
)
VISIBLE = {Status.COMPLETED, Status.FAILED, Status.DEAD, Status.PARKED}
_error_text: list[str] = [""]


def _handle(message: InboxMessage) -> None:
    Effect.objects.create(consumer="prop", message_id=message.message_id, attempt=1, pid=0)
    if _error_text[0] != "":
        raise RuntimeError(_error_text[0])


@pytest.fixture(autouse=True)
def prop_handler() -> Any:
    with handler("prop.evt", "prop", _handle, max_attempts=2):
        yield


def _reset() -> None:
    InboxMessage.objects.all().delete()
    Effect.objects.all().delete()


def _assert_one_visible_row(expect_status: set[str]) -> InboxMessage:
    rows = list(InboxMessage.objects.all())
    assert len(rows) == 1, rows
    row = rows[0]
    assert row.status in expect_status, (row.status, row.last_error)
    if row.status in (Status.FAILED, Status.DEAD, Status.PARKED):
        assert row.last_error, "a row that failed says why"
    return row


@PROFILE
@given(
    consumer=st.one_of(st.just("prop"), SHORT_TEXT),
    message_id=IDS,
    event_type=st.one_of(st.just("prop.evt"), SHORT_TEXT),
    payload=JSON,
    headers=st.one_of(st.none(), st.dictionaries(SHORT_TEXT, JSON, max_size=3), JSON),
    source=st.one_of(st.none(), SHORT_TEXT),
    key=st.one_of(st.none(), SHORT_TEXT),
    error=st.one_of(st.just(""), ANY_TEXT),
)
def test_deliver_refuses_cleanly_or_keeps_one_visible_row(
    consumer: Any, message_id: Any, event_type: Any, payload: Any, headers: Any,
    source: Any, key: Any, error: str,
) -> None:  # fmt: skip
    _reset()
    _error_text[0] = error
    try:
        outcome = deliver(
            consumer=consumer, message_id=message_id, event_type=event_type, payload=payload,
            headers=headers, source=source, key=key,
        )  # fmt: skip
    except InvalidMessage as exc:
        assert isinstance(exc, ValueError) and str(exc), "a clear message"
        assert InboxMessage.objects.count() == 0
        return
    row = _assert_one_visible_row(VISIBLE)
    assert outcome in (Outcome.PROCESSED, Outcome.FAILED, Outcome.DEAD)
    assert (row.status == Status.COMPLETED) == (outcome is Outcome.PROCESSED)
    assert Effect.objects.count() == (1 if outcome is Outcome.PROCESSED else 0)


@PROFILE
@given(
    message_id=IDS,
    event_type=st.one_of(st.just("prop.evt"), SHORT_TEXT),
    payload=JSON,
    headers=st.one_of(st.none(), st.dictionaries(SHORT_TEXT, JSON, max_size=3)),
    error=st.one_of(st.just(""), ANY_TEXT),
)
def test_store_then_a_worker_never_leaves_a_row_stuck(
    message_id: Any, event_type: Any, payload: Any, headers: Any, error: str
) -> None:
    from django_inbox.processing.worker import Worker

    _reset()
    _error_text[0] = error
    try:
        created = store(
            consumer="prop", message_id=message_id, event_type=event_type, payload=payload,
            headers=headers,
        )  # fmt: skip
    except InvalidMessage:
        assert InboxMessage.objects.count() == 0
        return
    assert created is True
    Worker(["prop"], until_idle=0, poll_interval=0).run_once()
    _assert_one_visible_row(VISIBLE)


CONTENT_TYPES = st.one_of(
    st.sampled_from(
        ["application/json", "application/cloudevents+json", "text/plain", "", "x/y+json"]
    ),
    SHORT_TEXT,
)
ENCODINGS = st.one_of(
    st.sampled_from(["utf-8", "undefined", "latin-1", "binary", "utf-16", "rot13", "base64"]),
    st.none(),
    SHORT_TEXT,
)
BODIES = st.one_of(
    st.binary(max_size=200),
    JSON.map(lambda value: _dumps(value).encode("utf-8", "surrogatepass")),
    st.builds(
        lambda n, t: _dumps({"id": n, "type": t, "n": 1}).encode("utf-8", "surrogatepass"),
        SHORT_TEXT,
        SHORT_TEXT,
    ),
)


def _dumps(value: Any) -> str:
    import json

    return json.dumps(value, allow_nan=True)


@PROFILE
@given(
    body=BODIES,
    content_type=CONTENT_TYPES,
    encoding=ENCODINGS,
    message_id=st.one_of(st.none(), SHORT_TEXT, st.binary(max_size=8), st.integers()),
    event_type=st.one_of(st.none(), st.just("prop.evt"), SHORT_TEXT),
    headers=st.dictionaries(
        st.sampled_from(["message_id", "ce-id", "ce-source", "ce-type", "key", "x-any"])
        | SHORT_TEXT,
        st.one_of(SHORT_TEXT, st.integers(), st.binary(max_size=8), st.floats(), JSON),
        max_size=4,
    ),
    redelivered=st.booleans(),
    mode=st.sampled_from(list(AckMode)),
    error=st.one_of(st.just(""), SHORT_TEXT),
)
def test_any_broker_message_is_refused_or_kept_in_one_visible_row(
    body: bytes, content_type: str, encoding: Any, message_id: Any, event_type: Any,
    headers: dict[str, Any], redelivered: bool, mode: AckMode, error: str,
) -> None:  # fmt: skip
    _reset()
    _error_text[0] = error
    properties: dict[str, Any] = {}
    if message_id is not None:
        properties["message_id"] = message_id
    if event_type is not None:
        properties["type"] = event_type
    message = Message(
        body=body, content_type=content_type, content_encoding=encoding, headers=headers,
        properties=properties, delivery_info={"redelivered": redelivered},
    )  # fmt: skip
    intake = Intake(
        consumer="prop", queue_name="q", ack_mode=mode, batching=False, envelope=parse,
        raw_limit=1024,
    )  # fmt: skip

    decision = intake.decide(message, flush=lambda: None)

    if decision.action is Action.REFUSE:
        assert InboxMessage.objects.count() == 0
        return
    assert decision.action is Action.ACK
    statuses = {Status.RECEIVED, Status.DEAD} if mode is AckMode.AFTER_STORE else VISIBLE
    row = _assert_one_visible_row(statuses)
    assert row.message_id == decision.message_id
    assert not (isinstance(row.payload, float) and not math.isfinite(row.payload))
