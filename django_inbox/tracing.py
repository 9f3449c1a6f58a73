"""Traces: with ``opentelemetry-api`` installed (extra ``otel``), every attempt of a handler
runs in a span that continues the W3C trace context its message arrived with, and the
outbox's messages carry the context of the span that wrote them.

- An attempt's span, ``inbox process <consumer> <event_type>`` (kind ``CONSUMER``), is a child
  of the ``traceparent``/``tracestate`` in the row's headers: kept on the row, so a retry hours
  later joins the same trace. Its attributes follow OpenTelemetry's messaging conventions
  where they fit (``messaging.operation.type`` ``process``, ``messaging.consumer.group.name``,
  ``messaging.message.id``) and name the rest ``inbox.*`` (consumer, event type, attempt,
  outcome); never the payload or the headers' values.
- ``publish()`` writes the current span's context into the outbox row's headers; the relay's
  publication is a span (``outbox publish <destination>``, kind ``PRODUCER``) in that trace.

Without ``opentelemetry-api`` nothing of OpenTelemetry is imported, and each function here
costs one check. With the API but no SDK configured (its default provider), no span is made:
``publish()`` passes the incoming trace headers on as it does without OpenTelemetry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from .exceptions import Park, Reject, Retry

#: The headers of W3C Trace Context.
TRACE_HEADERS = ("traceparent", "tracestate")

_api: Any = None  # the opentelemetry modules once looked for; False when absent


def _opentelemetry() -> Any:
    global _api
    if _api is None:
        try:
            from opentelemetry import propagate, trace
        except ImportError:
            _api = False
        else:
            _api = (trace, propagate)
    return _api


def _parent(headers: Any) -> Any:
    """The context of the trace headers in ``headers`` (``None`` when there are none)."""
    if not isinstance(headers, Mapping):
        return None
    carrier = {name: headers[name] for name in TRACE_HEADERS if isinstance(headers.get(name), str)}
    if "traceparent" not in carrier:
        return None
    _, propagate = _opentelemetry()
    return propagate.extract(carrier)


_tracer: tuple[Any, Any] = (None, None)  # (provider, its tracer)


def _tracing() -> Any:
    """The tracer of the configured provider; ``None`` without OpenTelemetry, or while no SDK
    is configured (the API's default provider only makes no-op spans: building them cost
    13-34 µs per attempt, for nothing)."""
    api = _opentelemetry()
    if not api:
        return None
    trace, _ = api
    provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    global _tracer
    if _tracer[0] is not provider:
        _tracer = (provider, provider.get_tracer("django_inbox"))
    return _tracer[1]


def attempt_span(message: Any) -> AbstractContextManager[Any]:
    """The span of one attempt of ``message``'s handler (nothing without OpenTelemetry)."""
    tracer = _tracing()
    if tracer is None:
        return nullcontext()
    return _attempt_span(tracer, message)


def _outcome(exc: BaseException) -> str:
    for kind in (Reject, Park, Retry):
        if isinstance(exc, kind):
            return kind.__name__.lower()
    return "error"


@contextmanager
def _attempt_span(tracer: Any, message: Any) -> Iterator[Any]:
    trace, _ = _opentelemetry()
    with tracer.start_as_current_span(
        f"inbox process {message.consumer} {message.event_type}",
        context=_parent(message.headers),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "messaging.operation.type": "process",
            "messaging.consumer.group.name": message.consumer,
            "messaging.message.id": message.message_id,
            "inbox.consumer": message.consumer,
            "inbox.event_type": message.event_type,
            "inbox.attempt": int(message.attempts or 0),
            "inbox.rerun": bool(getattr(message, "rerun", False)),
        },
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield span
        except BaseException as exc:
            outcome = _outcome(exc)
            span.set_attribute("inbox.outcome", outcome)
            if outcome == "error":
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise
        span.set_attribute("inbox.outcome", "handled")


def current_headers(taken: Mapping[str, Any]) -> dict[str, str]:
    """The current span's trace headers, unless ``taken`` (the caller's own) has a
    ``traceparent``; none without OpenTelemetry, without an SDK, or outside a span."""
    if "traceparent" in taken or _tracing() is None:
        return {}
    trace, propagate = _opentelemetry()
    if not trace.get_current_span().get_span_context().is_valid:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {name: carrier[name] for name in TRACE_HEADERS if name in carrier and name not in taken}


def publish_span(headers: Any, destination: str, message_id: str) -> AbstractContextManager[Any]:
    """The span of the relay's publication of one outbox row, in the trace of its headers."""
    tracer = _tracing()
    if tracer is None:
        return nullcontext()
    trace, _ = _opentelemetry()
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        f"outbox publish {destination}",
        context=_parent(headers),
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.operation.type": "send",
            "messaging.destination.name": destination,
            "messaging.message.id": message_id,
        },
    )
