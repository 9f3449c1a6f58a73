"""Observability: the signals, the structured log lines, the Prometheus metrics and the health
view, and the canary run proving that no payload or header value ever reaches a log line.

Signals are sent on commit, so the tests that listen to them (and to the metrics they feed)
run in transactional tests; the log and gauge tests need no commit.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import transaction
from django.test import Client, override_settings
from django.urls import path
from django.utils import timezone
from kombu import Queue

from django_inbox import Outcome, UnknownConsumer, deliver, signals, store, store_dead
from django_inbox.contrib.health import health_view
from django_inbox.models import InboxMessage
from django_inbox.services import collect, park, process_due, reclaim, replay, select
from tests import brokers

try:
    from prometheus_client import CollectorRegistry, generate_latest  # noqa: F401 (system tests)
    from prometheus_client.parser import text_string_to_metric_families

    from django_inbox.contrib import prometheus
except ImportError:  # the prometheus extra is not installed: its tests are skipped
    prometheus = None  # type: ignore[assignment]
needs_prometheus = pytest.mark.skipif(prometheus is None, reason="needs prometheus-client")

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]
Heard = list[tuple[str, dict[str, Any]]]
CONSUMER = "effects"
EVENT = "effect.write"
OUTCOMES = (
    "received",
    "duplicate",
    "processed",
    "failed",
    "dead",
    "parked",
    "replayed",
    "reclaimed",
)

#: The test-only URLconf (``override_settings(ROOT_URLCONF=__name__)``).
urlpatterns = [path("health/", health_view)]
if prometheus is not None:
    urlpatterns.append(path("metrics/", prometheus.metrics_view))


def send(message_id: str, event_type: str = EVENT, **payload: Any) -> Outcome:
    return deliver(consumer=CONSUMER, message_id=message_id, event_type=event_type, payload=payload)


def row(message_id: str) -> InboxMessage:
    return InboxMessage.objects.get(consumer=CONSUMER, message_id=message_id)


def make_stuck(message_id: str, attempts: int, **payload: Any) -> InboxMessage:
    """A stored row left ``in_progress`` by a worker whose lease expired 30 s ago."""
    assert store(consumer=CONSUMER, message_id=message_id, event_type=EVENT, payload=payload)
    return expire(message_id, attempts)


def expire(message_id: str, attempts: int) -> InboxMessage:
    """Make a stored row look claimed 60 s ago by a worker whose lease expired 30 s ago."""
    now = timezone.now()
    InboxMessage.objects.filter(consumer=CONSUMER, message_id=message_id).update(
        status=Status.IN_PROGRESS,
        attempts=attempts,
        lease_id=uuid.uuid4().hex,
        locked_until=now - timedelta(seconds=30),
        next_attempt_at=now - timedelta(seconds=30),
        updated_at=now - timedelta(seconds=60),
    )
    return row(message_id)


def drain(consumer: str = CONSUMER, deadline: float = 60.0) -> None:
    """Run ``process_due`` until no row of ``consumer`` is still to process (waiting out
    retry backoffs, which are at most 0.05 s for ``effects``)."""
    end = time.monotonic() + deadline
    while True:
        process_due([consumer])
        waiting = InboxMessage.objects.filter(
            consumer=consumer, status__in=[Status.RECEIVED, Status.FAILED]
        )
        if not waiting.exists():
            return
        assert time.monotonic() < end, list(waiting.values_list("message_id", "status"))
        time.sleep(0.02)


def wait_due(message_id: str) -> None:
    due = row(message_id).next_attempt_at
    assert due is not None
    time.sleep(max(0.0, (due - timezone.now()).total_seconds()) + 0.01)


# --- signals ---------------------------------------------------------------------------------


@pytest.fixture
def heard() -> Iterator[Heard]:
    """Every inbox signal sent during the test, as ``(kind, kwargs)``, in order."""
    calls: Heard = []

    def listener(kind: str) -> Callable[..., None]:
        def receive(sender: Any, **kwargs: Any) -> None:
            kwargs.pop("signal")
            calls.append((kind, {"sender": sender, **kwargs}))

        return receive

    for kind, signal in signals.SIGNALS.items():
        signal.connect(listener(kind), weak=False, dispatch_uid=f"test_observability.{kind}")
    yield calls
    for kind, signal in signals.SIGNALS.items():
        signal.disconnect(dispatch_uid=f"test_observability.{kind}")


def kinds(calls: Heard) -> list[str]:
    return [kind for kind, _ in calls]


def only(calls: Heard, kind: str) -> dict[str, Any]:
    found = [kwargs for k, kwargs in calls if k == kind]
    assert len(found) == 1, kinds(calls)
    return found[0]


def same_message(kwargs: dict[str, Any], message: InboxMessage) -> None:
    assert kwargs["sender"] is InboxMessage
    assert (kwargs["consumer"], kwargs["message_id"], kwargs["event_type"]) == (
        message.consumer,
        message.message_id,
        message.event_type,
    )


@pytest.mark.django_db(transaction=True)
def test_deliver_sends_received_then_processed(heard: Heard) -> None:
    assert send("s-ok", n=1) is Outcome.PROCESSED

    assert kinds(heard) == ["received", "processed"]
    message = row("s-ok")
    received, processed = heard[0][1], heard[1][1]
    for kwargs in (received, processed):
        same_message(kwargs, message)
        assert kwargs["pk"] == message.pk
        assert kwargs["extra"] == {}
    assert (received["attempt"], received["duration"]) == (0, None)
    assert processed["attempt"] == 1
    assert processed["duration"] > 0
    assert processed["message"].pk == message.pk


@pytest.mark.django_db(transaction=True)
def test_duplicate_sends_only_duplicate(heard: Heard) -> None:
    assert send("s-dup") is Outcome.PROCESSED
    heard.clear()

    assert send("s-dup") is Outcome.DUPLICATE

    assert kinds(heard) == ["duplicate"]
    duplicate = heard[0][1]
    same_message(duplicate, row("s-dup"))
    assert (duplicate["pk"], duplicate["attempt"], duplicate["duration"]) == (None, 0, None)


@pytest.mark.django_db(transaction=True)
def test_reject_sends_dead_and_park_sends_parked(heard: Heard) -> None:
    assert send("s-reject", reject="not for us") is Outcome.DEAD
    assert kinds(heard) == ["received", "dead"]
    dead = only(heard, "dead")
    same_message(dead, row("s-reject"))
    assert (dead["pk"], dead["attempt"]) == (row("s-reject").pk, 1)
    assert dead["extra"] == {"error_type": "Reject"}
    assert dead["duration"] is not None
    heard.clear()

    assert send("s-park", park="later") is Outcome.PARKED
    assert kinds(heard) == ["received", "parked"]
    parked = only(heard, "parked")
    same_message(parked, row("s-park"))
    assert parked["extra"] == {"error_type": "Park"}


@pytest.mark.django_db(transaction=True)
def test_failure_sends_failed_with_retry_at_and_error_type(heard: Heard) -> None:
    assert send("s-fail", fail_times=1) is Outcome.FAILED

    assert kinds(heard) == ["received", "failed"]
    failed = only(heard, "failed")
    message = row("s-fail")
    same_message(failed, message)
    assert (failed["pk"], failed["attempt"]) == (message.pk, 1)
    assert failed["duration"] > 0
    assert failed["extra"]["error_type"] == "RuntimeError"
    assert datetime.fromisoformat(failed["extra"]["retry_at"]) == message.next_attempt_at
    assert set(failed["extra"]) == {"error_type", "retry_at"}


@pytest.mark.django_db(transaction=True)
def test_store_sends_received_and_a_worker_sends_processed(heard: Heard) -> None:
    assert store(consumer=CONSUMER, message_id="s-store", event_type=EVENT, payload={})
    assert kinds(heard) == ["received"]
    received = heard[0][1]
    message = row("s-store")
    same_message(received, message)
    assert (received["pk"], received["attempt"], received["duration"]) == (message.pk, 0, None)
    heard.clear()

    stats = process_due([CONSUMER])

    assert stats.outcomes == {"processed": 1}
    assert kinds(heard) == ["processed"]
    processed = heard[0][1]
    same_message(processed, message)
    assert (processed["pk"], processed["attempt"]) == (message.pk, 1)
    assert processed["duration"] > 0
    assert processed["message"].pk == message.pk


@pytest.mark.django_db(transaction=True)
def test_reclaim_sends_reclaimed_and_dead_past_the_cap(heard: Heard) -> None:
    retried = make_stuck("s-stuck-1", attempts=1)
    given_up = make_stuck("s-stuck-3", attempts=3)  # effects allows 3 attempts
    heard.clear()

    result = reclaim(consumer=CONSUMER)

    assert (result.failed, result.dead, result.released) == (1, 1, 0)
    assert Counter(kinds(heard)) == {"reclaimed": 2, "dead": 1}
    by_id = {(kind, kw["message_id"]): kw for kind, kw in heard}
    first = by_id[("reclaimed", "s-stuck-1")]
    same_message(first, retried)
    assert (first["pk"], first["attempt"], first["duration"]) == (retried.pk, 1, None)
    assert first["extra"]["outcome"] == "failed"
    assert first["extra"]["error_type"] == "LeaseExpired"
    assert datetime.fromisoformat(first["extra"]["retry_at"]) == row("s-stuck-1").next_attempt_at
    last = by_id[("reclaimed", "s-stuck-3")]
    assert last["extra"] == {"outcome": "dead", "error_type": "LeaseExpired"}
    dead = by_id[("dead", "s-stuck-3")]
    assert (dead["pk"], dead["attempt"]) == (given_up.pk, 3)
    assert dead["extra"] == {"error_type": "LeaseExpired"}


@pytest.mark.django_db(transaction=True)
def test_a_worker_taking_over_an_expired_lease_sends_reclaimed_then_processed(
    heard: Heard,
) -> None:
    stuck = make_stuck("s-takeover", attempts=1)
    heard.clear()

    assert process_due([CONSUMER]).outcomes == {"processed": 1}

    assert kinds(heard) == ["reclaimed", "processed"]
    reclaimed, processed = heard[0][1], heard[1][1]
    same_message(reclaimed, stuck)
    assert reclaimed["extra"]["outcome"] == "in_progress"  # claimed again at once
    assert processed["attempt"] == 2


@pytest.mark.django_db(transaction=True)
def test_replay_sends_replayed_with_the_operator(heard: Heard) -> None:
    assert send("s-replay", reject="no") is Outcome.DEAD
    message = row("s-replay")
    heard.clear()

    result = replay(select(pks=[message.pk]), actor="alice", reason="fixed the bug", via="python")

    assert result.total == 1
    assert kinds(heard) == ["replayed"]
    replayed = heard[0][1]
    same_message(replayed, message)
    assert (replayed["pk"], replayed["attempt"], replayed["duration"]) == (message.pk, 1, None)
    assert replayed["extra"] == {
        "actor": "alice",
        "via": "python",
        "reason": "fixed the bug",
        "previous_status": "dead",
    }


@pytest.mark.django_db(transaction=True)
def test_park_action_sends_parked_with_the_operator(heard: Heard) -> None:
    assert store(consumer=CONSUMER, message_id="s-hold", event_type=EVENT, payload={})
    message = row("s-hold")
    heard.clear()

    result = park(select(pks=[message.pk]), actor="bob", reason="hold it", via="python")

    assert result.total == 1
    assert kinds(heard) == ["parked"]
    parked = heard[0][1]
    same_message(parked, message)
    assert parked["pk"] == message.pk
    assert parked["extra"] == {
        "actor": "bob",
        "via": "python",
        "reason": "hold it",
        "previous_status": "received",
    }
    assert row("s-hold").status == Status.PARKED


class Rollback(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_signals_are_sent_only_after_commit(heard: Heard) -> None:
    with pytest.raises(Rollback), transaction.atomic():
        assert send("s-rolled-back") is Outcome.PROCESSED
        assert send("s-rolled-back-dead", reject="no") is Outcome.DEAD
        assert heard == []  # not before the commit
        raise Rollback

    assert heard == []  # and never: nothing was committed
    assert not InboxMessage.objects.exists()

    with transaction.atomic():
        assert send("s-committed") is Outcome.PROCESSED
        assert heard == []
    assert kinds(heard) == ["received", "processed"]


@pytest.mark.django_db(transaction=True)
def test_a_raising_receiver_does_not_break_deliver(
    heard: Heard, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="django_inbox")

    secret = "the receiver broke: " + uuid.uuid4().hex  # as if it quoted the payload

    def broken_receiver(sender: Any, **kwargs: Any) -> None:
        raise RuntimeError(secret)

    signals.message_processed.connect(broken_receiver, weak=False, dispatch_uid="test.broken")
    try:
        assert send("s-receiver") is Outcome.PROCESSED
    finally:
        signals.message_processed.disconnect(dispatch_uid="test.broken")

    assert row("s-receiver").status == Status.COMPLETED
    assert kinds(heard) == ["received", "processed"]  # the other receiver still heard it
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    text = logging.Formatter().format(errors[0])
    assert errors[0].name == "django_inbox"
    assert "broken_receiver" in text and "RuntimeError" in text and "s-receiver" in text
    assert "raise RuntimeError(secret)" in text  # where: the frames, with their source lines
    # The exception's message may quote the payload (receivers get the message): not logged.
    assert secret not in text


# --- structured log lines ------------------------------------------------------------------


def records_of(caplog: pytest.LogCaptureFixture, message_id: str) -> dict[str, logging.LogRecord]:
    """The records of one message by outcome, checking each outcome is logged once, except
    ``received`` after a failed first attempt: logged when its row was inserted, rolled back
    with the handler's writes, and inserted again with the failure (documented)."""
    found: dict[str, logging.LogRecord] = {}
    outcomes: list[str] = []
    for record in caplog.records:
        if getattr(record, "inbox_message_id", None) == message_id:
            assert record.name == "django_inbox"
            outcomes.append(record.inbox_outcome)  # type: ignore[attr-defined]
            found[record.inbox_outcome] = record  # type: ignore[attr-defined]
    counts = Counter(outcomes)
    failed_first = counts.keys() & {"failed", "dead", "parked"} and counts["processed"] == 0
    assert counts == {
        outcome: 2 if outcome == "received" and failed_first else 1 for outcome in counts
    }
    return found


def fields(record: logging.LogRecord) -> dict[str, Any]:
    found = {name: getattr(record, name) for name in vars(record) if name.startswith("inbox_")}
    # Plain values, as a JSON formatter needs them (not a status enum).
    assert {type(value) for value in found.values()} <= {str, int, float, type(None)}, found
    assert type(found["inbox_outcome"]) is str
    return found


@pytest.mark.django_db
def test_log_records_carry_the_inbox_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="django_inbox")
    assert send("l-ok") is Outcome.PROCESSED
    assert send("l-fail", fail_times=1) is Outcome.FAILED
    assert send("l-dead", reject="no") is Outcome.DEAD

    common = {"inbox_consumer": CONSUMER, "inbox_event_type": EVENT}
    ok = records_of(caplog, "l-ok")
    assert set(ok) == {"received", "processed"}
    assert ok["received"].levelno == logging.DEBUG
    assert fields(ok["received"]) == {
        **common,
        "inbox_message_id": "l-ok",
        "inbox_attempt": 0,
        "inbox_outcome": "received",
        "inbox_duration_ms": None,
        "inbox_error_type": None,
        "inbox_retry_at": None,
    }
    processed = ok["processed"]
    assert processed.levelno == logging.INFO
    assert processed.inbox_duration_ms > 0  # type: ignore[attr-defined]
    assert fields(processed) == {
        **common,
        "inbox_message_id": "l-ok",
        "inbox_attempt": 1,
        "inbox_outcome": "processed",
        "inbox_duration_ms": processed.inbox_duration_ms,  # type: ignore[attr-defined]
        "inbox_error_type": None,
        "inbox_retry_at": None,
    }
    assert "l-ok" in processed.getMessage() and "processed" in processed.getMessage()

    failed = records_of(caplog, "l-fail")["failed"]
    assert failed.levelno == logging.WARNING
    assert failed.inbox_duration_ms > 0  # type: ignore[attr-defined]
    assert fields(failed) == {
        **common,
        "inbox_message_id": "l-fail",
        "inbox_attempt": 1,
        "inbox_outcome": "failed",
        "inbox_duration_ms": failed.inbox_duration_ms,  # type: ignore[attr-defined]
        "inbox_error_type": "RuntimeError",
        "inbox_retry_at": row("l-fail").next_attempt_at.isoformat(),  # type: ignore[union-attr]
    }

    dead = records_of(caplog, "l-dead")["dead"]
    assert dead.levelno == logging.ERROR
    assert fields(dead) == {
        **common,
        "inbox_message_id": "l-dead",
        "inbox_attempt": 1,
        "inbox_outcome": "dead",
        "inbox_duration_ms": dead.inbox_duration_ms,  # type: ignore[attr-defined]
        "inbox_error_type": "Reject",
        "inbox_retry_at": None,
    }


@pytest.mark.django_db
def test_a_duplicate_logs_nothing_at_info_or_above(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="django_inbox")
    assert send("l-dup") is Outcome.PROCESSED
    caplog.clear()

    assert send("l-dup") is Outcome.DUPLICATE

    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert fields(caplog.records[0])["inbox_outcome"] == "duplicate"
    assert fields(caplog.records[0])["inbox_attempt"] == 0


# --- Prometheus ----------------------------------------------------------------------------


def uninstall(registry: Any) -> None:
    """Undo :func:`prometheus.install` on ``registry`` (tests only)."""
    metrics = prometheus._installed.pop(registry)
    for outcome, signal in prometheus.OUTCOMES.items():
        signal.disconnect(dispatch_uid=f"django_inbox.prometheus.{id(registry)}.{outcome}")
    for collector in (metrics.messages, metrics.duplicates, metrics.processing):
        registry.unregister(collector)
    stats = prometheus._with_gauges.pop(registry, None)
    if stats is not None:
        registry.unregister(stats)


@pytest.fixture(autouse=True)
def _uninstall_metrics() -> Iterator[None]:
    """Registries a test installed the metrics on (the global one too) are cleaned up, so no
    receiver outlives the test."""
    if prometheus is None:
        yield
        return
    before = set(prometheus._installed)
    yield
    for registry in set(prometheus._installed) - before:
        uninstall(registry)


def sample(registry: Any, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def series(registry: Any) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in registry.collect()
        for s in family.samples
    }


@needs_prometheus
@pytest.mark.django_db(transaction=True)
def test_counters_and_histogram_count_each_outcome() -> None:
    registry = CollectorRegistry()
    prometheus.install(registry, gauges=False)
    labels = {"consumer": CONSUMER, "event_type": EVENT}

    assert send("p-ok") is Outcome.PROCESSED
    assert send("p-ok") is Outcome.DUPLICATE
    assert send("p-retry", fail_times=1) is Outcome.FAILED
    assert send("p-reject", reject="no") is Outcome.DEAD
    assert send("p-park", park="later") is Outcome.PARKED
    wait_due("p-retry")
    assert process_due([CONSUMER]).outcomes == {"processed": 1}
    assert replay(select(message_ids=["p-reject"]), actor="tester").total == 1
    make_stuck("p-stuck", attempts=1)
    assert reclaim(consumer=CONSUMER).failed == 1

    def total(outcome: str) -> float:
        return sample(registry, "inbox_messages_total", outcome=outcome, **labels)

    assert {o: total(o) for o in OUTCOMES} == {
        "received": 5,
        "duplicate": 1,
        "processed": 2,
        "failed": 1,
        "dead": 1,
        "parked": 1,
        "replayed": 1,
        "reclaimed": 1,
    }
    assert sample(registry, "inbox_duplicates_skipped_total", **labels) == 1

    def observed(outcome: str) -> float:
        return sample(registry, "inbox_processing_seconds_count", outcome=outcome, **labels)

    assert [observed(o) for o in ("processed", "failed", "dead", "parked")] == [2, 1, 1, 1]
    assert sample(registry, "inbox_processing_seconds_sum", outcome="processed", **labels) > 0
    assert not any(name.startswith("inbox_pending") for name, _ in series(registry))


@needs_prometheus
@pytest.mark.django_db
def test_gauges_match_inbox_stats() -> None:
    registry = CollectorRegistry()
    prometheus.install(registry)
    assert send("g-dead", reject="no") is Outcome.DEAD
    assert send("g-park", park="later") is Outcome.PARKED
    assert store(consumer=CONSUMER, message_id="g-old", event_type=EVENT, payload={})
    assert store(consumer=CONSUMER, message_id="g-new", event_type=EVENT, payload={})
    InboxMessage.objects.filter(message_id="g-old").update(
        next_attempt_at=timezone.now() - timedelta(seconds=120)
    )
    make_stuck("g-stuck", attempts=1)

    found = {
        name: sample(registry, f"inbox_{name}", consumer=CONSUMER)
        for name in ("pending", "in_progress", "stuck", "dead", "parked")
    }
    age = sample(registry, "inbox_oldest_pending_age_seconds", consumer=CONSUMER)
    stats = collect().consumers[CONSUMER]

    assert found == {
        "pending": stats.pending,
        "in_progress": stats.counts["in_progress"],
        "stuck": stats.stuck,
        "dead": stats.counts["dead"],
        "parked": stats.counts["parked"],
    }
    assert found == {"pending": 3, "in_progress": 1, "stuck": 1, "dead": 1, "parked": 1}
    assert 120 <= age <= stats.oldest_pending_age  # scraped just before collect() ran
    # Every consumer with handlers has its gauges, rows or not.
    assert registry.get_sample_value("inbox_dead", {"consumer": "stream"}) == 0


@needs_prometheus
@pytest.mark.django_db(transaction=True)
def test_unknown_event_types_and_consumers_are_labelled_other() -> None:
    registry = CollectorRegistry()
    prometheus.install(registry, gauges=False)
    assert send("h-first", event_type="hostile-first") is Outcome.DEAD
    before = series(registry)

    for n in range(100):
        assert send(f"h-{n}", event_type=f"hostile-{uuid.uuid4().hex}") is Outcome.DEAD
    # deliver() refuses a consumer without handlers (UnknownConsumer); what a broker consumer
    # keeps dead for one still reaches the metrics.
    with pytest.raises(UnknownConsumer):
        deliver(consumer="nobody-" + uuid.uuid4().hex, message_id="h-x", event_type="x", payload={})
    assert store_dead(
        consumer="nobody-" + uuid.uuid4().hex, message_id="h-x", event_type="x", payload={},
        reason="undecodable",
    )  # fmt: skip

    after = series(registry)
    other = {"consumer": CONSUMER, "event_type": "other"}
    assert sample(registry, "inbox_messages_total", outcome="dead", **other) == 101
    assert sample(registry, "inbox_messages_total", outcome="received", **other) == 101
    # The unknown consumer adds its "other" series once; the 100 event types added none.
    assert {s for s in after - before if ("consumer", "other") not in s[1]} == set()
    assert (
        sample(
            registry, "inbox_messages_total", consumer="other", event_type="other", outcome="dead"
        )
        == 1
    )
    labels = {value for _, pairs in after for _, value in pairs}
    assert not any(value.startswith(("hostile", "nobody")) for value in labels)


@needs_prometheus
@pytest.mark.django_db(transaction=True)
def test_a_registry_installed_after_another_was_collected_gets_its_own_metrics() -> None:
    # install() used to key registries by id(): a new registry that reused the id of a
    # collected one got the old metrics (counting into the dead registry) and no gauges.
    first = CollectorRegistry()
    prometheus.install(first)
    del first
    second = CollectorRegistry()
    prometheus.install(second)

    assert send("r-ok") is Outcome.PROCESSED

    assert sample(second, "inbox_messages_total", consumer=CONSUMER, event_type=EVENT,
                  outcome="processed") == 1  # fmt: skip
    assert second.get_sample_value("inbox_pending", {"consumer": CONSUMER}) == 0


@needs_prometheus
@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_metrics_view_serves_the_exposition(client: Client) -> None:
    assert store(consumer=CONSUMER, message_id="v-1", event_type=EVENT, payload={})

    response = client.get("/metrics/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    assert {"inbox_messages", "inbox_processing_seconds", "inbox_pending"} <= set(families)
    pending = {s.labels["consumer"]: s.value for s in families["inbox_pending"].samples}
    assert pending[CONSUMER] == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def processed_count(exposition: str, consumer: str = CONSUMER) -> float | None:
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name == "inbox_messages_total" and s.labels == {
                "consumer": consumer,
                "event_type": EVENT,
                "outcome": "processed",
            }:
                return s.value
    return None


# --- health view ---------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(ROOT_URLCONF=__name__)
def test_health_view(client: Client) -> None:
    healthy = client.get("/health/")
    assert healthy.status_code == 200
    assert healthy.json()["healthy"] is True and healthy.json()["problems"] == []
    assert "no-cache" in healthy["Cache-Control"]
    assert client.post("/health/").status_code == 405

    assert send("hv-dead", reject="no") is Outcome.DEAD
    sick = client.get("/health/")
    assert sick.status_code == 503
    body = sick.json()
    assert body["healthy"] is False
    assert [(p["kind"], p["consumer"], p["value"]) for p in body["problems"]] == [
        ("dead", CONSUMER, 1)
    ]
    assert body["consumers"][CONSUMER]["counts"]["dead"] == 1

    assert client.get("/health/?ignore=dead").status_code == 200
    assert client.get("/health/?ignore=stuck,nonsense").status_code == 503
    assert client.get("/health/?consumer=stream").status_code == 200
    assert set(client.get("/health/?consumer=stream").json()["consumers"]) == {"stream"}
    assert client.get(f"/health/?consumer={CONSUMER}").status_code == 503

    assert store(consumer="stream", message_id="hv-old", event_type=EVENT, payload={})
    InboxMessage.objects.filter(message_id="hv-old").update(
        next_attempt_at=timezone.now() - timedelta(seconds=120)
    )
    with override_settings(INBOX_MAX_PENDING_AGE=60):
        late = client.get("/health/?consumer=stream")
        assert late.status_code == 503
        assert [p["kind"] for p in late.json()["problems"]] == ["pending_age"]
        assert client.get("/health/?consumer=stream&ignore=pending_age").status_code == 200


# --- the canary: no payload or header value in any log line --------------------------------


def publish(queue: str, messages: list[dict[str, Any]]) -> None:
    """Publish with kombu: ``body`` (text or JSON-able), ``headers``, ``properties``."""
    with brokers.connect(brokers.RABBITMQ) as connection:
        Queue(queue, routing_key=queue, durable=True)(connection.default_channel).declare()
        producer = connection.Producer()
        for message in messages:
            body = message["body"]
            producer.publish(
                body if isinstance(body, str) else json.dumps(body),
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
                headers=message["headers"],
                delivery_mode=2,
                retry=True,
                **message["properties"],
            )


def _request(url: str) -> Any:
    from django.test import RequestFactory

    return RequestFactory().get(url)


@pytest.mark.django_db
def test_an_id_with_control_characters_cannot_forge_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sender chooses its message ids: a newline in one must not start a line of the log
    that looks like the inbox's own. The text escapes it; the structured field keeps it."""
    caplog.set_level(logging.DEBUG, logger="django_inbox")
    forged = "evt_1\ninbox effects/effect.write evt_2 attempt 1: processed\u2028\x1b[31m"
    assert deliver(consumer="effects", message_id=forged, event_type="effect.write", payload={})

    lines = [r.getMessage() for r in caplog.records if getattr(r, "inbox_message_id", None)]
    assert lines and all("\n" not in line and "\u2028" not in line for line in lines)
    assert all("\x1b" not in line for line in lines)
    assert (
        "evt_1\\ninbox effects/effect.write evt_2 attempt 1: processed\\u2028\\x1b[31m" in lines[0]
    )
    assert {r.inbox_message_id for r in caplog.records if hasattr(r, "inbox_message_id")} == {
        forged
    }
