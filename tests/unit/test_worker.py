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

import pytest
from django.utils import timezone
from effects.models import Effect

from django_inbox import Outcome, Retry, deliver, store
from django_inbox.models import InboxMessage
from django_inbox.processing.retry import RetryPolicy
from django_inbox.registry import registry
from django_inbox.services import process_due
from tests.conftest import handler

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
