"""Observability: the signals, the structured log lines, the Prometheus metrics and the health

The parts that run real processes; the rest is in ``tests/unit/test_events.py``.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.request
import uuid
from collections import Counter
from typing import Any

import pytest

from django_inbox import Outcome, deliver, signals, store, store_dead
from django_inbox.contrib.health import health_view
from django_inbox.models import InboxMessage
from django_inbox.services import park, reclaim, replay, select
from tests import brokers
from tests.conftest import handler
from tests.unit.test_events import (
    CONSUMER,
    EVENT,
    CollectorRegistry,
    Manage,
    Status,
    _request,
    drain,
    expire,
    free_port,
    generate_latest,
    needs_prometheus,
    processed_count,
    prometheus,
    publish,
    row,
)


@needs_prometheus
@pytest.mark.postgres
@pytest.mark.slow
def test_inbox_process_serves_its_counts_on_metrics_port(manage: Manage) -> None:
    ids = [f"w-{n}" for n in range(7)]
    for message_id in ids:
        assert store(consumer=CONSUMER, message_id=message_id, event_type=EVENT, payload={})
    port = free_port()

    proc = manage(
        "inbox_process", "--consumer", CONSUMER, "--until-idle", "3", "--metrics-port", str(port)
    )
    seen, text = None, ""
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                text = answer.read().decode()
        except OSError:  # not listening yet
            time.sleep(0.05)
            continue
        seen = processed_count(text)
        if seen == len(ids):
            break
        time.sleep(0.05)
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 0, err[-3000:]
    assert f"handled {len(ids)}" in out
    assert seen == len(ids), text
    assert "inbox_pending" not in text  # a worker's endpoint never queries the database
    assert InboxMessage.objects.filter(status=Status.COMPLETED).count() == len(ids)


@pytest.mark.postgres
@pytest.mark.slow
def test_canary_in_payloads_and_headers_never_reaches_a_log_line(
    manage: Manage, caplog: pytest.LogCaptureFixture
) -> None:
    canary = "CANARY-" + uuid.uuid4().hex
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="django_inbox")
    registry = None if prometheus is None else CollectorRegistry()
    if prometheus is not None:
        prometheus.install(registry)
    headers = {"x-canary": canary, canary: canary, "nested": {"value": [canary]}}

    def payload(**behaviour: Any) -> dict[str, Any]:
        return {"note": canary, canary: canary, "list": [canary], **behaviour}

    def put(message_id: str, event_type: str = EVENT, **behaviour: Any) -> Outcome:
        return deliver(
            consumer=CONSUMER,
            message_id=message_id,
            event_type=event_type,
            payload=payload(**behaviour),
            headers=headers,
            source="source-" + canary,
            key="key-" + canary,
        )

    def put_later(message_id: str, **behaviour: Any) -> None:
        assert store(
            consumer=CONSUMER,
            message_id=message_id,
            event_type=EVENT,
            payload=payload(**behaviour),
            headers=headers,
        )

    def leaky(message: InboxMessage) -> None:
        # A handler whose exception quotes the payload: kept in the history, never logged.
        raise ValueError(f"cannot handle {message.payload['note']} ({message.headers})")

    def nosy(sender: Any, message: InboxMessage | None = None, **kwargs: Any) -> None:
        # A signal receiver whose exception quotes the payload.
        if message is not None:
            raise RuntimeError(f"the receiver saw {message.payload}")

    signals.message_processed.connect(nosy, weak=False, dispatch_uid="test.canary.nosy")
    try:
        with handler("effect.leaky", CONSUMER, leaky):
            # In process: deliver, duplicates, retries, dead letters, parking, unhandled types.
            assert put("k-ok-1") is Outcome.PROCESSED
            assert put("k-ok-1") is Outcome.DUPLICATE
            assert put("k-ok-2") is Outcome.PROCESSED
            assert put("k-ok-2") is Outcome.DUPLICATE
            assert put("k-retry", fail_times=2) is Outcome.FAILED
            assert put("k-reject", reject="rejected: " + canary) is Outcome.DEAD
            assert put("k-always", fail_always=True) is Outcome.FAILED
            assert put("k-leaky", event_type="effect.leaky") is Outcome.FAILED
            assert put("k-park", park="parked: " + canary) is Outcome.PARKED
            assert put("k-unknown", event_type="effect.unknown") is Outcome.DEAD
            assert store_dead(
                consumer=CONSUMER,
                message_id="k-undecodable",
                event_type=EVENT,
                payload={"raw": canary},
                reason="cannot decode " + canary,
                headers=headers,
            )
            put_later("k-stored")
            drain()
            statuses = dict(
                InboxMessage.objects.filter(consumer=CONSUMER).values_list("message_id", "status")
            )
            assert statuses == {
                "k-ok-1": "completed",
                "k-ok-2": "completed",
                "k-retry": "completed",
                "k-reject": "dead",
                "k-always": "dead",
                "k-leaky": "dead",
                "k-park": "parked",
                "k-unknown": "dead",
                "k-undecodable": "dead",
                "k-stored": "completed",
            }
            # The leaky handler's message (with the canary) is in the history, as allowed.
            assert canary in row("k-leaky").history[-1]["message"]
            assert canary in row("k-leaky").history[-1]["traceback"]

            # Operators replay every dead and parked row; the replays are processed again.
            replayed = replay(
                select(consumer=CONSUMER, statuses=["dead", "parked"]),
                actor="canary-test",
                reason="replaying",
                via="python",
            )
            assert replayed.total == 6
            drain()
            assert row("k-undecodable").status == Status.COMPLETED  # its payload is handled
            assert row("k-leaky").status == Status.DEAD
            assert row("k-park").status == Status.PARKED

            # Workers that died: reclaimed (one retried, one past its cap), an operator park.
            for message_id, attempts in (("k-stuck-1", 1), ("k-stuck-3", 3)):
                put_later(message_id)
                expire(message_id, attempts)
            reclaimed = reclaim(consumer=CONSUMER)
            assert (reclaimed.failed, reclaimed.dead) == (1, 1)
            assert row("k-stuck-3").status == Status.DEAD
            drain()
            assert row("k-stuck-1").status == Status.COMPLETED
            put_later("k-held")
            assert park(select(message_ids=["k-held"]), actor="canary-test", via="python").total

        # A real inbox_process run: retries, dead letters, parking, a dead worker's row.
        put_later("p-ok")
        put_later("p-retry", fail_times=1)
        put_later("p-always", fail_always=True)
        put_later("p-reject", reject="rejected: " + canary)
        put_later("p-park", park="parked: " + canary)
        put_later("p-stuck")
        expire("p-stuck", 1)
        debug = {"INBOX_LOG_LEVEL": "DEBUG"}
        proc = manage("inbox_process", "--consumer", CONSUMER, "--until-idle", "3", env=debug)
        process_out, process_err = proc.communicate(timeout=120)
        assert proc.returncode == 0, process_err[-3000:]
        statuses = dict(
            InboxMessage.objects.filter(message_id__startswith="p-").values_list(
                "message_id", "status"
            )
        )
        assert statuses == {
            "p-ok": "completed",
            "p-retry": "completed",
            "p-always": "dead",
            "p-reject": "dead",
            "p-park": "parked",
            "p-stuck": "completed",
        }

        # A real inbox_consume run against RabbitMQ.
        queue = brokers.new_queue_name("inbox-canary")
        properties = {
            "correlation_id": canary,
            "reply_to": "reply-" + canary,
            "app_id": "app-" + canary,
        }

        def message(message_id: str | None, body: Any, type_: str = EVENT) -> dict[str, Any]:
            found = {"type": type_, **properties}
            if message_id is not None:
                found["message_id"] = message_id
            return {"body": body, "headers": headers, "properties": found}

        try:
            publish(
                queue,
                [
                    message("c-ok", payload()),
                    message("c-ok", payload()),  # a duplicate
                    message("c-retry", payload(fail_times=1)),
                    message("c-always", payload(fail_always=True)),
                    message("c-reject", payload(reject="rejected: " + canary)),
                    message("c-park", payload(park="parked: " + canary)),
                    message("c-undecodable", "{not json: " + canary),
                    message(None, payload()),  # refused: no id
                    message("c-unknown", payload(), "effect.unknown"),
                ],
            )
            env = {**debug, "INBOX_BROKER_TRANSPORT_OPTIONS": "{}"}
            proc = manage(
                "inbox_consume", "--consumer", CONSUMER, "--queue", queue,
                "--broker", brokers.RABBITMQ, "--until-idle", "3", env=env,
            )  # fmt: skip
            consume_out, consume_err = proc.communicate(timeout=120)
        finally:
            brokers.delete_queue(brokers.RABBITMQ, queue)
        assert proc.returncode == 0, consume_err[-3000:]
        assert "acked 8" in consume_out and "refused 1" in consume_out, consume_out
        statuses = dict(
            InboxMessage.objects.filter(message_id__startswith="c-").values_list(
                "message_id", "status"
            )
        )
        assert statuses == {
            "c-ok": "completed",
            "c-retry": "completed",
            "c-always": "dead",
            "c-reject": "dead",
            "c-park": "parked",
            "c-undecodable": "dead",
            "c-unknown": "dead",
        }
        assert canary in json.dumps(row("c-ok").headers)  # the canary did reach the inbox
        assert row("c-ok").source == "app-" + canary
    finally:
        signals.message_processed.disconnect(dispatch_uid="test.canary.nosy")

    # Every in-process record, formatted with its traceback, and every attribute of it (what
    # a JSON formatter would print); the subprocesses' outputs; the metrics and health view.
    texts = [logging.Formatter().format(record) for record in caplog.records]
    texts += [repr(vars(record)) for record in caplog.records]
    outputs = {
        "inbox_process stdout": process_out,
        "inbox_process stderr": process_err,
        "inbox_consume stdout": consume_out,
        "inbox_consume stderr": consume_err,
    }
    leaks = [text for text in texts if canary in text]
    leaks += [f"{name}: {text}" for name, text in outputs.items() if canary in text]
    assert leaks == []
    if registry is not None:
        assert canary not in generate_latest(registry).decode()
    health = health_view(_request("/health/"))
    assert canary not in health.content.decode()

    # The run covered every outcome, so the absence of the canary means something.
    seen = Counter(getattr(r, "inbox_outcome", None) for r in caplog.records)
    lines = {name: len(text.splitlines()) for name, text in outputs.items()}
    print(f"canary absent from {len(caplog.records)} records {dict(seen)} and lines {lines}")
    outcomes = ("received", "duplicate", "processed", "failed", "dead", "parked")
    for outcome in (*outcomes, "replayed", "reclaimed"):
        assert seen[outcome] > 0, (outcome, seen)
    leaky_lines = [r for r in caplog.records if getattr(r, "inbox_message_id", "") == "k-leaky"]
    assert {r.inbox_error_type for r in leaky_lines if r.levelno >= logging.WARNING} == {  # type: ignore[attr-defined]
        "ValueError"
    }
    # the receiver's failure is logged, without its message
    assert sum("nosy" in r.getMessage() for r in caplog.records) == 6
    for outcome in outcomes[2:]:
        assert f": {outcome}" in process_err, process_err[-3000:]
    assert ": reclaimed" in process_err
    for outcome in outcomes:
        assert f": {outcome}" in consume_err, consume_err[-3000:]
    assert "without an id" in consume_err
