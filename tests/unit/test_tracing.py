"""Traces (``django_inbox.tracing``, extra ``otel``): each attempt in a span that continues the
trace its message arrived with, a retry in the same trace, and one connected trace from a
handler through the outbox, the relay and RabbitMQ to another consumer's handler. The spans
go to the SDK's in-memory exporter, through a tracer provider of the test's own (the global
one is left alone, so other tests see OpenTelemetry's no-ops)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_inbox import Reject, deliver, tracing
from django_inbox.broker.connection import BrokerConsumer
from django_inbox.models import InboxMessage
from django_inbox.outbox import publish
from django_inbox.outbox.services import relay
from django_inbox.services import process_due
from tests import brokers
from tests.conftest import ROOT, handler

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    yield exporter
    provider.shutdown()


def _attributes(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def _deliver(message_id: str, payload: dict[str, Any], **headers: str) -> None:
    """A message of consumer ``effects`` arriving with ``headers`` (its trace context)."""
    deliver(consumer="effects", message_id=message_id, event_type="effect.write",
            payload=payload, headers=headers)  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_an_attempt_continues_the_trace_its_message_arrived_with(spans: Any) -> None:
    _deliver("tr-1", {"card": "4111-secret"}, traceparent=TRACEPARENT, tracestate="vendor=1")

    (span,) = spans.get_finished_spans()
    assert span.name == "inbox process effects effect.write"
    assert span.kind == trace.SpanKind.CONSUMER
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{span.parent.span_id:016x}" == PARENT_ID
    assert _attributes(span) == {
        "messaging.operation.type": "process",
        "messaging.consumer.group.name": "effects",
        "messaging.message.id": "tr-1",
        "inbox.consumer": "effects",
        "inbox.event_type": "effect.write",
        "inbox.attempt": 1,
        "inbox.rerun": False,
        "inbox.outcome": "handled",
    }
    assert "4111-secret" not in repr(span.to_json())  # never the payload


@pytest.mark.django_db(transaction=True)
def test_a_retry_joins_the_same_trace_from_the_headers_kept_on_the_row(spans: Any) -> None:
    _deliver("tr-2", {"fail_times": 1}, traceparent=TRACEPARENT)
    row = InboxMessage.objects.get(message_id="tr-2")
    assert row.status == InboxMessage.Status.FAILED
    InboxMessage.objects.filter(pk=row.pk).update(next_attempt_at=row.received_at)  # due now
    process_due(["effects"])

    first, second = spans.get_finished_spans()
    assert {f"{s.context.trace_id:032x}" for s in (first, second)} == {TRACE_ID}
    assert [_attributes(s)["inbox.attempt"] for s in (first, second)] == [1, 2]
    assert _attributes(first)["inbox.outcome"] == "error"
    assert first.status.status_code == trace.StatusCode.ERROR
    assert [event.name for event in first.events] == ["exception"]
    assert _attributes(second)["inbox.outcome"] == "handled"


@pytest.mark.django_db(transaction=True)
def test_one_trace_from_a_handler_through_the_outbox_and_rabbitmq_to_another_handler(
    spans: Any,
) -> None:
    got: list[str] = []
    with brokers.declared_queue("inbox-test-trace") as queue:

        def first(message: Any) -> None:
            publish("trace.next", {"n": 1}, routing_key=queue)

        def second(message: Any) -> None:
            got.append(message.message_id)

        with handler("trace.start", "trace_a", first), handler("trace.next", "trace_b", second):
            deliver(
                consumer="trace_a",
                message_id="tr-3",
                event_type="trace.start",
                payload={},
                headers={"traceparent": TRACEPARENT},
            )
            relay(brokers.RABBITMQ, until_idle=0.5).run()
            BrokerConsumer(
                consumer="trace_b", queue=queue, broker_url=brokers.RABBITMQ, until_idle=0.5
            ).run()

    assert len(got) == 1
    by_name = {span.name: span for span in spans.get_finished_spans()}
    assert set(by_name) == {
        "inbox process trace_a trace.start",
        f"outbox publish {queue}",
        "inbox process trace_b trace.next",
    }
    a, sent, b = (
        by_name["inbox process trace_a trace.start"],
        by_name[f"outbox publish {queue}"],
        by_name["inbox process trace_b trace.next"],
    )
    assert {f"{s.context.trace_id:032x}" for s in (a, sent, b)} == {TRACE_ID}
    assert a.parent.span_id == int(PARENT_ID, 16)
    assert sent.parent.span_id == a.context.span_id  # the relay publishes what a wrote
    assert b.parent.span_id == a.context.span_id  # b continues the context a's row carried
    assert sent.kind == trace.SpanKind.PRODUCER


@pytest.mark.django_db(transaction=True)
def test_a_rejection_of_a_subclass_is_a_reject_not_an_error(spans: Any) -> None:
    class OrderMissing(Reject):
        pass

    def refuse(message: Any) -> None:
        raise OrderMissing("no such order")

    with handler("order.paid", "trace_c", refuse):
        deliver(consumer="trace_c", message_id="tr-4", event_type="order.paid", payload={})

    (span,) = spans.get_finished_spans()
    assert _attributes(span)["inbox.outcome"] == "reject"
    assert span.status.status_code != trace.StatusCode.ERROR


def test_with_the_api_but_no_sdk_no_span_is_made_and_headers_pass_as_they_came() -> None:
    """The API's default provider (no SDK configured): spans would be no-ops, so none is
    built, and publish() carries the incoming headers (tests/unit/test_outbox_headers.py)."""
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    assert tracing.attempt_span(object()).__enter__() is None
    assert tracing.current_headers({}) == {}


def test_a_callers_own_traceparent_keeps_its_pair(spans: Any) -> None:
    with trace.get_tracer_provider().get_tracer("t").start_as_current_span("caller"):
        assert set(tracing.current_headers({})) == {"traceparent"}
        assert tracing.current_headers({"traceparent": TRACEPARENT}) == {}


def test_without_opentelemetry_nothing_of_it_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import fails, as if absent
    monkeypatch.setattr(tracing, "_api", None)

    with tracing.attempt_span(object()) as span:
        assert span is None
    assert tracing.current_headers({}) == {}
    with tracing.publish_span({"traceparent": TRACEPARENT}, "q", "m") as span:
        assert span is None
    assert tracing._api is False


def test_importing_the_package_imports_nothing_of_opentelemetry() -> None:
    code = (
        "import django, sys; django.setup()\n"
        "import django_inbox, django_inbox.processing.attempts, django_inbox.outbox.publisher\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={  # no database: the subprocess only imports
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "testproject.settings",
            "PYTHONPATH": os.pathsep.join([str(ROOT / "testproject"), str(ROOT)]),
        },
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
