"""Retries: flaky handlers complete exactly once, backoff follows the policy, poison goes dead.

The process-based tests drain stored messages with real ``manage.py inbox_process`` workers
on PostgreSQL and end by counting committed effects (lost = 0, doubled = 0). The policy tests
run in-process and work on any database.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from statistics import mean

import pytest
from django.utils import timezone
from effects.models import Effect

from django_inbox import Outcome, Retry, deliver, store
from django_inbox.models import InboxMessage
from django_inbox.registry import registry
from django_inbox.retry import RetryPolicy
from django_inbox.services import process_due
from tests.conftest import handler
from tests.effects import effect_counts, lost_and_doubled

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]

#: Messages drained by two workers; every fifth fails on its first two attempts.
N = 1000
FLAKY_EVERY = 5
HANDLED = re.compile(r"inbox_process: handled (\d+) \((.*)\)")


def at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def effects_policy() -> RetryPolicy:
    return RetryPolicy.for_handler("effects", registry.get("effects", "effect.write"))


def store_effect(message_id: str, **payload: object) -> None:
    assert store(
        consumer="effects", message_id=message_id, event_type="effect.write", payload=payload
    )


def outcomes_of(out: str) -> Counter[str]:
    """The outcome counts an ``inbox_process`` run printed on exit."""
    match = HANDLED.search(out)
    assert match, out
    counts: Counter[str] = Counter()
    if match.group(2) != "nothing":
        for part in match.group(2).split(", "):
            name, number = part.rsplit(" ", 1)
            counts[name] = int(number)
    assert sum(counts.values()) == int(match.group(1))
    return counts


@pytest.mark.postgres
@pytest.mark.slow
def test_flaky_handler_completes_every_message_once_with_policy_backoff(manage: Manage) -> None:
    expected = {f"msg-{n:04d}" for n in range(N)}
    flaky = {f"msg-{n:04d}" for n in range(0, N, FLAKY_EVERY)}
    for message_id in sorted(expected):
        if message_id in flaky:
            store_effect(message_id, fail_times=2)
        else:
            store_effect(message_id)

    workers = [
        manage("inbox_process", "--consumer", "effects", "--batch-size", "20", "--until-idle", "3")
        for _ in range(2)
    ]
    totals: Counter[str] = Counter()
    per_worker = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err[-3000:]
        per_worker.append(outcomes_of(out))
        totals += per_worker[-1]

    # Exactly one committed effect per message, by the attempt that completed it.
    lost, doubled = lost_and_doubled(expected)
    print(
        f"{N} messages, {len(flaky)} flaky, 2 workers {per_worker}: lost={lost} doubled={doubled}"
    )
    assert (lost, doubled) == (0, 0)
    assert set(effect_counts().values()) == {1}
    assert len(effect_counts()) == N
    effect_attempts = dict(Effect.objects.values_list("message_id", "attempt"))
    assert {mid: effect_attempts[mid] for mid in flaky} == dict.fromkeys(flaky, 3)
    assert set(effect_attempts[mid] for mid in expected - flaky) == {1}
    # The two workers between them ran each healthy message once and each flaky one thrice.
    assert totals == {"processed": N, "failed": 2 * len(flaky)}

    rows = list(InboxMessage.objects.all())
    assert len(rows) == N
    assert {row.status for row in rows} == {Status.COMPLETED}
    histogram = Counter(row.attempts for row in rows)
    print(f"attempts histogram: {dict(sorted(histogram.items()))}")
    assert histogram == {1: N - len(flaky), 3: len(flaky)}

    policy = effects_policy()
    assert policy.max_attempts == 3
    ratios = []
    for row in rows:
        errors = row.errors
        if row.message_id not in flaky:
            assert errors == [], row.message_id
            continue
        assert [e["attempt"] for e in errors] == [1, 2], row.message_id
        assert [e["outcome"] for e in errors] == [Status.FAILED, Status.FAILED]
        assert {e["type"] for e in errors} == {"RuntimeError"}
        # When each next attempt ran: the next error's time, then the completion.
        next_starts = [at(errors[1]["at"]), row.processed_at]
        for entry, next_start in zip(errors, next_starts, strict=True):
            assert entry["at"] and entry["retry_at"], entry
            delay = (at(entry["retry_at"]) - at(entry["at"])).total_seconds()
            ceiling = policy.ceiling(entry["attempt"])
            assert 0 <= delay <= ceiling, (row.message_id, entry)
            ratios.append(delay / ceiling)
            assert next_start >= at(entry["retry_at"]), (row.message_id, entry, next_start)
    assert len(ratios) == 2 * len(flaky)
    # Full jitter: delay / ceiling is uniform on [0, 1] (mean 0.5, sd of the mean ~0.014).
    print(
        f"backoff: {len(ratios)} delays, delay/ceiling mean={mean(ratios):.3f} "
        f"min={min(ratios):.3f} max={max(ratios):.3f}"
    )
    assert 0.35 <= mean(ratios) <= 0.65


@pytest.mark.postgres
@pytest.mark.slow
def test_poison_message_goes_dead_without_holding_up_healthy_ones(manage: Manage) -> None:
    store_effect("poison", fail_always=True)
    healthy = {f"healthy-{n:03d}" for n in range(120)}
    for message_id in sorted(healthy):
        store_effect(message_id)

    worker = manage(
        "inbox_process", "--consumer", "effects", "--batch-size", "25", "--until-idle", "2"
    )
    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err[-3000:]
    assert outcomes_of(out) == {"processed": len(healthy), "failed": 2, "dead": 1}

    poison = InboxMessage.objects.get(message_id="poison")
    print(f"poison: status={poison.status} attempts={poison.attempts} errors={len(poison.errors)}")
    assert (poison.status, poison.attempts) == (Status.DEAD, 3)
    errors = poison.errors
    assert [e["attempt"] for e in errors] == [1, 2, 3]
    assert [e["outcome"] for e in errors] == [Status.FAILED, Status.FAILED, Status.DEAD]
    for entry in errors:
        assert entry["type"] == "RuntimeError"
        assert entry["message"] == "this message always fails"
        assert "Traceback" in entry["traceback"]
        assert "this message always fails" in entry["traceback"]
        assert entry["at"]
    assert errors[0]["retry_at"] and errors[1]["retry_at"]
    assert errors[2]["retry_at"] is None
    assert poison.next_attempt_at is None
    assert poison.last_error == "RuntimeError: this message always fails"
    assert "poison" not in effect_counts(), "every poison attempt was rolled back"

    # The healthy messages stored after it ran once each, none waiting for its retries.
    rows = InboxMessage.objects.filter(message_id__in=healthy)
    assert set(rows.values_list("status", flat=True)) == {Status.COMPLETED}
    assert set(rows.values_list("attempts", flat=True)) == {1}
    assert not any(row.errors for row in rows)
    went_dead = at(errors[2]["at"])
    assert max(rows.values_list("processed_at", flat=True)) < went_dead
    lost, doubled = lost_and_doubled(healthy)
    assert (lost, doubled) == (0, 0)


# --- a handler's own policy, in-process (any database) -------------------------------------


def always_fails(message: InboxMessage) -> None:
    raise RuntimeError(f"attempt {message.attempts} failed")


def retry_later(message: InboxMessage) -> None:
    raise Retry("the downstream asked us to come back", delay=RETRY_DELAY)


RETRY_DELAY = 120.0


def make_due(**filters: object) -> None:
    InboxMessage.objects.filter(**filters).update(next_attempt_at=timezone.now())


def error_delay(entry: dict[str, object]) -> float:
    return (at(str(entry["retry_at"])) - at(str(entry["at"]))).total_seconds()


@pytest.mark.django_db
def test_handler_policy_overrides_the_consumer_policy() -> None:
    consumer_policy = effects_policy()
    with handler(
        "policy.override",
        "effects",
        always_fails,
        max_attempts=2,
        backoff_base=10.0,
        backoff_max=10.0,
    ):
        policy = RetryPolicy.for_handler("effects", registry.get("effects", "policy.override"))
        assert (policy.max_attempts, policy.backoff_base, policy.backoff_max) == (2, 10.0, 10.0)
        assert policy.lease == consumer_policy.lease

        ids = [f"override-{n}" for n in range(20)]
        outcomes = [
            deliver(consumer="effects", message_id=mid, event_type="policy.override", payload={})
            for mid in ids
        ]
        assert outcomes == [Outcome.FAILED] * len(ids)
        delays = []
        for row in InboxMessage.objects.filter(message_id__in=ids):
            (entry,) = row.errors
            delays.append(error_delay(entry))
            assert 0 <= delays[-1] <= policy.ceiling(1) == 10.0
            assert row.next_attempt_at == at(entry["retry_at"])
        # The consumer's own policy would cap the first delay at 0.01 s.
        assert max(delays) > consumer_policy.ceiling(1)

        # Attempt 2 is the handler's last (the consumer allows 3).
        make_due(message_id__in=ids)
        stats = process_due(["effects"])
        assert stats.outcomes == {"dead": len(ids)}
        for row in InboxMessage.objects.filter(message_id__in=ids):
            assert (row.status, row.attempts) == (Status.DEAD, 2)
            assert [e["outcome"] for e in row.errors] == [Status.FAILED, Status.DEAD]
            assert row.errors[1]["retry_at"] is None
    assert not Effect.objects.exists()


@pytest.mark.django_db
def test_retry_with_a_delay_is_honoured_on_every_attempt() -> None:
    with handler("policy.retry", "effects", retry_later):
        outcome = deliver(
            consumer="effects", message_id="retry-1", event_type="policy.retry", payload={}
        )
        assert outcome == Outcome.FAILED
        row = InboxMessage.objects.get(message_id="retry-1")
        (first,) = row.errors
        assert (first["type"], first["outcome"]) == ("Retry", Status.FAILED)
        assert first["message"] == "the downstream asked us to come back"
        assert abs(error_delay(first) - RETRY_DELAY) <= 1.0
        assert row.next_attempt_at == at(first["retry_at"])

        # Not due before its delay has passed: a worker leaves it alone.
        assert process_due(["effects"]).handled == 0
        row.refresh_from_db()
        assert (row.status, row.attempts, len(row.errors)) == (Status.FAILED, 1, 1)

        # The worker's failure path honours the delay too, beyond the consumer's backoff_max.
        make_due(message_id="retry-1")
        assert process_due(["effects"]).outcomes == {"failed": 1}
        row.refresh_from_db()
        assert (row.status, row.attempts) == (Status.FAILED, 2)
        second = row.errors[1]
        assert (second["attempt"], second["type"]) == (2, "Retry")
        assert abs(error_delay(second) - RETRY_DELAY) <= 1.0
        assert effects_policy().backoff_max < RETRY_DELAY
        assert process_due(["effects"]).handled == 0

        # max_attempts still wins over the requested delay.
        make_due(message_id="retry-1")
        assert process_due(["effects"]).outcomes == {"dead": 1}
        row.refresh_from_db()
        assert (row.status, row.attempts, row.next_attempt_at) == (Status.DEAD, 3, None)
        assert [e["outcome"] for e in row.errors] == ["failed", "failed", "dead"]


@pytest.mark.django_db
def test_retry_without_a_delay_uses_the_policy_backoff() -> None:
    def retry_policy(message: InboxMessage) -> None:
        raise Retry("again")

    with handler("policy.backoff", "effects", retry_policy, backoff_base=30.0, backoff_max=60.0):
        policy = RetryPolicy.for_handler("effects", registry.get("effects", "policy.backoff"))
        ids = [f"backoff-{n}" for n in range(10)]
        for mid in ids:
            deliver(consumer="effects", message_id=mid, event_type="policy.backoff", payload={})
        make_due(message_id__in=ids)
        assert process_due(["effects"]).outcomes == {"failed": len(ids)}
        second_delays = []
        for row in InboxMessage.objects.filter(message_id__in=ids):
            first, second = row.errors
            assert 0 <= error_delay(first) <= policy.ceiling(1) == 30.0
            second_delays.append(error_delay(second))
            assert 0 <= second_delays[-1] <= policy.ceiling(2) == 60.0
        # The consumer's own backoff would cap every delay at 0.05 s.
        assert max(second_delays) > effects_policy().backoff_max
