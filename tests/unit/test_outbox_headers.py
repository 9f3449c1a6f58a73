"""The headers ``publish()`` writes: the caller's own refused unless AMQP can carry them, the
trace context carried from an inbox message dropped (never fatal) unless valid and bounded.
Against the real database, no broker (tests/system/test_outbox.py sends them)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest

from django_inbox import InvalidPayload, PayloadTooLarge, deliver
from django_inbox.outbox import publish
from django_inbox.outbox.models import OutboxMessage
from tests.conftest import handler
from tests.databases import on_mariadb

pytestmark = pytest.mark.django_db(transaction=True)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
VALID_TRACE = {
    "traceparent": TRACEPARENT,
    "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
    "baggage": "userId=alice,serverNode=DF%2028;ttl=30,isProduction=false",
    "b3": "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90",
    "x-b3-traceid": "80f198ee56343ba864fe8b2a57d3eff7",
    "x-b3-spanid": "e457b5a2e4d86bd1",
}


def refused(headers: Any, match: str, error: type[Exception] = InvalidPayload) -> None:
    with pytest.raises(error, match=match):
        publish("t", {}, routing_key="q", headers=headers)


def test_header_names_that_are_not_text_are_invalid_payload() -> None:
    refused({1: "x"}, "header names must be strings, got int 1")
    refused({("a", "b"): "x"}, "header names must be strings, got tuple")
    assert not OutboxMessage.objects.exists()


def test_headers_amqp_cannot_carry_are_refused_with_where_they_are() -> None:
    refused({"n": 2**63}, r"headers\['n'\] is an integer of 64 bits; AMQP carries integers")
    refused({"n": -(2**63) - 1}, "AMQP carries integers from -2\\*\\*63 to 2\\*\\*63-1")
    refused({"a": {"b": [1, 2**64]}}, r"headers\['a'\]\['b'\]\[1\] is an integer of 65 bits")
    refused({"é" * 128: 1}, "header name 'ééé.* is 256 bytes of UTF-8; AMQP allows 255")
    refused({"a": {"k" * 256: 1}}, r"a name in headers\['a'\], 'kkk.* is 256 bytes")
    assert not OutboxMessage.objects.exists()
    edges = {"max": 2**63 - 1, "min": -(2**63), "é" * 127 + "x": {"k" * 255: [None, 1.5]}}
    publish("t", {}, routing_key="q", headers=edges)
    assert OutboxMessage.objects.get().headers == edges


def test_the_header_limit_is_named_as_what_it_is_and_counts_the_amqp_encoding() -> None:
    with pytest.raises(PayloadTooLarge) as raised:
        publish("t", {}, routing_key="q", headers={"big": "x" * 70_000})
    assert "INBOX_MAX_PAYLOAD_BYTES" not in str(raised.value)
    assert "the outbox's fixed header limit (64 KiB" in str(raised.value)
    # 60 KB of JSON, 150 KB as AMQP writes it (5 bytes an integer): past one frame.
    refused(
        {"n": [1] * 30_000}, "as an AMQP field table; the outbox's fixed header", PayloadTooLarge
    )
    assert not OutboxMessage.objects.exists()


def published_from(headers: dict[str, Any], own: dict[str, Any] | None = None) -> dict[str, Any]:
    """The headers of the row a handler publishes while running a message with ``headers``."""

    def on_paid(message: Any) -> None:
        publish("receipt.due", {}, routing_key="receipts", headers=own)

    with handler("order.paid", "trace", on_paid):
        outcome = deliver(
            consumer="trace", message_id=str(uuid.uuid4()), event_type="order.paid", payload={},
            headers=headers,
        )  # fmt: skip
    assert outcome == "processed", outcome
    return dict(OutboxMessage.objects.get().headers)


def test_valid_trace_headers_are_carried_and_the_callers_own_win() -> None:
    sent = published_from(VALID_TRACE)
    assert {name: sent[name] for name in VALID_TRACE} == VALID_TRACE
    OutboxMessage.objects.all().delete()
    sent = published_from(VALID_TRACE, own={"baggage": "mine=1"})
    assert sent["baggage"] == "mine=1" and sent["traceparent"] == TRACEPARENT


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("traceparent", 2**64, "not a string"),
        ("traceparent", "00-abc-def-01", "not a W3C traceparent"),
        ("traceparent", "00-" + "0" * 32 + "-00f067aa0ba902b7-01", "all zeros"),
        ("traceparent", "ff" + TRACEPARENT[2:], "known version"),
        ("traceparent", TRACEPARENT + "-extra", "known version"),
        ("tracestate", ",".join(f"k{n}=v" for n in range(33)), "over 32 list members"),
        ("tracestate", "k=" + "v" * 600, "over 512 characters"),
        ("tracestate", "Upper=v", "not a W3C tracestate"),
        ("baggage", "k=" + "v" * 100_000, "over 8192 bytes"),
        ("baggage", ",".join(f"k{n}=v" for n in range(181)), "over 180 list members"),
        ("baggage", "no equals sign", "not a W3C baggage"),
        ("b3", "not-b3", "not a B3 single header"),
        ("b3", "0" * 32 + "-e457b5a2e4d86bd1", "all zeros"),
        ("x-b3-traceid", "80F198EE56343BA8", "not a B3 trace id"),
        ("x-b3-spanid", ["e457b5a2e4d86bd1"], "not a string"),
    ],
)
def test_an_invalid_or_oversized_trace_header_is_dropped_never_fatal(
    name: str, value: Any, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    incoming = {**VALID_TRACE, name: value}
    with caplog.at_level(logging.INFO, logger="django_inbox.outbox"):
        sent = published_from(incoming)
    assert name not in sent
    kept = {k: v for k, v in VALID_TRACE.items() if k != name}
    if name == "traceparent":
        kept.pop("tracestate")  # W3C: no tracestate without a valid traceparent
    assert {k: sent[k] for k in kept} == kept
    said = [r.getMessage() for r in caplog.records if r.name == "django_inbox.outbox"]
    assert any(f"{name} header is not passed on: " in line and why in line for line in said), said
    assert not any(str(value)[:40] in line for line in said if len(str(value)) > 20)


def test_trace_headers_that_would_pass_the_header_limit_are_dropped_not_the_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    own = {"data": "x" * (64 * 1024 - 200)}  # fits alone, not with the carried baggage
    with caplog.at_level(logging.INFO, logger="django_inbox.outbox"):
        sent = published_from({"baggage": "k=" + "v" * 8000}, own=own)
    assert "baggage" not in sent and sent["data"] == own["data"]
    assert "baggage header is not passed on: with it the headers would pass" in caplog.text


def test_headers_nested_past_what_amqp_encodes_are_invalid_payload() -> None:
    """With INBOX_MAX_JSON_DEPTH raised past Python's recursion, py-amqp's table encoder
    raised RecursionError out of publish(). (MariaDB refuses them sooner: its JSON columns
    store 31 levels whatever the setting says.)"""
    from django.test import override_settings

    mariadb = on_mariadb()

    deep: Any = 1
    for _ in range(700):  # JSON encodes it; py-amqp's encoder takes two frames a level
        deep = {"a": deep}
    with override_settings(INBOX_MAX_JSON_DEPTH=100_000):
        refused({"deep": deep}, "more than 31 levels deep; MariaDB" if mariadb else "too deep")
    assert not OutboxMessage.objects.exists()


@pytest.mark.parametrize("value", [1e19, -1e19, 9.3e18, float(2**64)])
def test_a_float_the_table_keeps_as_an_integer_beyond_64_bits_is_refused(value: float) -> None:
    """PostgreSQL's jsonb keeps 1e19 as 10000000000000000000: the relay read back an integer
    AMQP cannot carry and the row died at its first attempt."""
    refused({"x-amount": value}, "keeps as an integer beyond 64 bits")
    refused({"nested": {"x": [value]}}, "keeps as an integer beyond 64 bits")
    publish("t", {}, routing_key="q", headers={"x-amount": 1.5e19 / 3 / 1e10, "y": 9.2e18})
    assert OutboxMessage.objects.count() == 1


@pytest.mark.parametrize("name", ["CC", "BCC"])
@pytest.mark.parametrize("value", ["orders", 5, ["orders", 5], {"a": "b"}])
def test_rabbitmqs_routing_headers_must_be_lists_of_routing_keys(name: str, value: Any) -> None:
    """RabbitMQ closed the channel (406) under the whole batch for a CC header that is no list
    of strings; its batch-mates went out twice."""
    refused({name: value}, f"header {name!r} routes the message")
    publish("t", {}, routing_key="q", headers={name: ["orders", "audit"], "cc": "any"})
    assert OutboxMessage.objects.count() == 1
