"""Retries: flaky handlers complete exactly once, backoff follows the policy, poison goes dead.

The parts that run real processes; the rest is in ``tests/unit/test_worker.py``.
"""

from __future__ import annotations

from collections import Counter
from statistics import mean

import pytest
from effects.models import Effect

from django_inbox.models import InboxMessage
from tests.effects import effect_counts, lost_and_doubled
from tests.unit.test_worker import (
    FLAKY_EVERY,
    Manage,
    N,
    Status,
    at,
    effects_policy,
    outcomes_of,
    store_effect,
)


@pytest.mark.server_db
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


@pytest.mark.server_db
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
