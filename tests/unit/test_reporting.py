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

from django_inbox import deliver, reporting
from django_inbox.models import InboxMessage


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


def test_without_sentry_nothing_is_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sentry_sdk", None)
    monkeypatch.setattr(reporting, "_sdk", None)
    reporting.handler_failed(RuntimeError("x"), object())  # neither raises nor reads the row
    assert reporting._sdk is False
