"""Sentry (``django_inbox.reporting``): a handler's failure is captured with the inbox's
context (consumer, message id, event type, attempt), never its payload; the inbox's own
interruptions and a handler's deliberate outcomes (reject, park, retry) are not errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.transport import Transport

from django_inbox import Retry, deliver, reporting, store
from django_inbox.models import InboxMessage
from django_inbox.services import process_due
from tests.conftest import handler


class Captured(Transport):
    events: list[dict[str, Any]] = []

    def capture_envelope(self, envelope: Any) -> None:
        for item in envelope.items:
            if item.type == "event":
                Captured.events.append(item.payload.json)


@pytest.fixture
def sentry() -> Iterator[list[dict[str, Any]]]:
    Captured.events = []
    sentry_sdk.init(
        dsn="https://public@sentry.example.com/1", transport=Captured, default_integrations=False
    )
    yield Captured.events
    sentry_sdk.flush()
    sentry_sdk.get_global_scope().set_client(None)  # no client: as if never initialised


@pytest.mark.django_db(transaction=True)
def test_a_handlers_failure_is_captured_with_the_inbox_context_and_no_payload(
    sentry: list[dict[str, Any]],
) -> None:
    deliver(
        consumer="effects",
        message_id="s-1",
        event_type="effect.write",
        payload={"fail_text": "card 4111-secret declined"},
        headers={"authorization": "Bearer token-secret"},
    )
    sentry_sdk.flush()

    (event,) = sentry
    assert event["contexts"]["inbox"] == {
        "consumer": "effects",
        "message_id": "s-1",
        "event_type": "effect.write",
        "attempt": 1,
    }
    assert event["tags"] == {"inbox.consumer": "effects", "inbox.event_type": "effect.write"}
    (exception,) = event["exception"]["values"]
    assert exception["type"] == "RuntimeError"
    text = json.dumps(event)
    assert "token-secret" not in text
    assert exception["stacktrace"]["frames"], "the traceback is sent"
    assert not any("vars" in frame for frame in exception["stacktrace"]["frames"])
    # The payload is not sent, but for what the exception's own message quotes of it.
    assert text.count("4111-secret") == text.count("card 4111-secret declined")
    assert InboxMessage.objects.get(message_id="s-1").status == InboxMessage.Status.FAILED


@pytest.mark.django_db(transaction=True)
def test_rejecting_or_parking_is_no_error(sentry: list[dict[str, Any]]) -> None:
    deliver(consumer="effects", message_id="s-2", event_type="effect.write",
            payload={"reject": "no such order"})  # fmt: skip
    deliver(consumer="effects", message_id="s-3", event_type="effect.write",
            payload={"park": "wait for the supplier"})  # fmt: skip
    sentry_sdk.flush()
    assert sentry == []


@pytest.mark.django_db(transaction=True)
def test_a_failure_in_a_shared_transaction_is_captured_once_not_per_run(
    sentry: list[dict[str, Any]],
) -> None:
    """A batch run in one transaction (commit_every) that fails runs again one message per
    transaction: the failing handler raises twice, and is reported once, where recorded."""
    for n in range(3):
        store(consumer="effects", message_id=f"b-{n}", event_type="effect.write",
              payload={"fail_text": "bad"} if n == 1 else {})  # fmt: skip
    process_due(["effects"], commit_every=3, max_messages=3)
    sentry_sdk.flush()

    row = InboxMessage.objects.get(message_id="b-1")
    assert row.attempts == 1, row.history
    assert [event["contexts"]["inbox"]["message_id"] for event in sentry] == ["b-1"]


@pytest.mark.django_db(transaction=True)
def test_a_retry_the_handler_asks_for_is_no_error(sentry: list[dict[str, Any]]) -> None:
    def later(message: Any) -> None:
        raise Retry("not yet", delay=60)

    with handler("order.paid", "retrying", later):
        deliver(consumer="retrying", message_id="s-4", event_type="order.paid", payload={})
    sentry_sdk.flush()
    assert sentry == []


def test_without_sentry_nothing_is_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sentry_sdk", None)
    monkeypatch.setattr(reporting, "_sdk", None)
    reporting.handler_failed(RuntimeError("x"), object())  # neither raises nor reads the row
    assert reporting._sdk is False
