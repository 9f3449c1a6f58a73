"""``django_inbox.processing.retry``: effective policy per handler, and exponential backoff
with jitter."""

from __future__ import annotations

import random

import pytest
from django.test import override_settings

from django_inbox.processing.retry import RetryPolicy
from django_inbox.registry import Handler


def noop(message: object) -> None:
    pass


def make_handler(**options: object) -> Handler:
    return Handler(consumer="inventory", event_type="order.placed", func=noop, **options)  # type: ignore[arg-type]


LAYERED = override_settings(
    INBOX_MAX_ATTEMPTS=9,
    INBOX_BACKOFF_BASE=1,
    INBOX_BACKOFF_MAX=100,
    INBOX_LEASE=60,
    INBOX_CONSUMERS={"inventory": {"max_attempts": 4, "backoff_base": "5s", "backoff_max": "2m"}},
)


@LAYERED
def test_handler_arguments_win_over_consumer_and_globals() -> None:
    handler = make_handler(max_attempts=7, backoff_base=0.5, backoff_max=30.0)
    assert RetryPolicy.for_handler("inventory", handler) == RetryPolicy(
        max_attempts=7, backoff_base=0.5, backoff_max=30.0, lease=60.0
    )


@LAYERED
def test_consumer_settings_win_over_globals() -> None:
    assert RetryPolicy.for_handler("inventory", make_handler()) == RetryPolicy(
        max_attempts=4, backoff_base=5.0, backoff_max=120.0, lease=60.0
    )
    assert RetryPolicy.for_handler("inventory", None) == RetryPolicy(
        max_attempts=4, backoff_base=5.0, backoff_max=120.0, lease=60.0
    )


@LAYERED
def test_globals_apply_to_unconfigured_consumer() -> None:
    assert RetryPolicy.for_handler("shipping", None) == RetryPolicy(
        max_attempts=9, backoff_base=1.0, backoff_max=100.0, lease=60.0
    )


@LAYERED
def test_handler_overrides_one_key_at_a_time() -> None:
    policy = RetryPolicy.for_handler("inventory", make_handler(max_attempts=2))
    assert (policy.max_attempts, policy.backoff_base, policy.backoff_max) == (2, 5.0, 120.0)
    policy = RetryPolicy.for_handler("inventory", make_handler(backoff_max=6.0))
    assert (policy.max_attempts, policy.backoff_base, policy.backoff_max) == (4, 5.0, 6.0)


@LAYERED
def test_handler_zero_backoff_is_not_treated_as_unset() -> None:
    policy = RetryPolicy.for_handler("inventory", make_handler(backoff_base=0.0, backoff_max=0.0))
    assert policy.backoff_base == 0.0
    assert policy.backoff_max == 0.0
    assert policy.ceiling(3) == 0.0


def test_testproject_payments_policy() -> None:
    policy = RetryPolicy.for_handler("payments", None)
    assert policy == RetryPolicy(max_attempts=4, backoff_base=0.05, backoff_max=0.2, lease=300.0)


def test_ceiling_doubles_then_caps() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=2.0, backoff_max=100.0, lease=60.0)
    assert [policy.ceiling(n) for n in range(1, 10)] == [2, 4, 8, 16, 32, 64, 100, 100, 100]


def test_ceiling_of_attempt_zero_or_less_is_the_base() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=3.0, backoff_max=100.0, lease=60.0)
    assert policy.ceiling(0) == 3.0
    assert policy.ceiling(-4) == 3.0


def test_ceiling_is_capped_even_when_base_exceeds_max() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=50.0, backoff_max=10.0, lease=60.0)
    assert policy.ceiling(1) == 10.0


@pytest.mark.parametrize("attempt", [62, 63, 64, 65, 1024, 1025, 5000, 10**9, 10**18])
def test_huge_attempt_numbers_do_not_overflow(attempt: int) -> None:
    policy = RetryPolicy(max_attempts=10**19, backoff_base=2.0, backoff_max=3600.0, lease=60.0)
    assert policy.ceiling(attempt) == 3600.0
    delay = policy.delay(attempt, random.Random(attempt))
    assert 0.0 <= delay <= 3600.0


def test_huge_attempts_with_a_huge_cap_stay_finite() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=1e300, backoff_max=1e308, lease=60.0)
    for attempt in (1, 10, 63, 64, 2000):
        ceiling = policy.ceiling(attempt)
        assert ceiling <= 1e308
        assert ceiling == ceiling  # not NaN


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 20])
def test_delay_is_within_zero_and_ceiling(attempt: int) -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=2.0, backoff_max=100.0, lease=60.0)
    rng = random.Random(1234)
    ceiling = policy.ceiling(attempt)
    delays = [policy.delay(attempt, rng) for _ in range(500)]
    assert all(0.0 <= d <= ceiling for d in delays)
    # Full jitter: spread over the whole range, not clustered at the ceiling.
    assert min(delays) < ceiling * 0.1
    assert max(delays) > ceiling * 0.9
    assert len(set(delays)) > 450


def test_delay_is_reproducible_with_a_seeded_rng() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=2.0, backoff_max=100.0, lease=60.0)
    first = [policy.delay(n, random.Random(42)) for n in range(1, 10)]
    second = [policy.delay(n, random.Random(42)) for n in range(1, 10)]
    assert first == second
    other = [policy.delay(n, random.Random(43)) for n in range(1, 10)]
    assert first != other


def test_delay_without_rng_uses_module_random() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=1.0, backoff_max=8.0, lease=60.0)
    delays = [policy.delay(4) for _ in range(50)]
    assert all(0.0 <= d <= 8.0 for d in delays)
    assert len(set(delays)) > 1


def test_zero_ceiling_gives_zero_delay() -> None:
    policy = RetryPolicy(max_attempts=10, backoff_base=0.0, backoff_max=0.0, lease=60.0)
    assert policy.delay(5, random.Random(0)) == 0.0


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), 200 * 365 * 86400 + 1])
def test_retry_refuses_delays_that_cannot_be_scheduled(delay: float) -> None:
    from django_inbox import Retry

    with pytest.raises(ValueError, match="Retry delay"):
        Retry("later", delay=delay)


def test_retry_accepts_the_longest_schedulable_delay() -> None:
    from django_inbox import Retry

    # 200 years: the bound of every duration (durations.MAX_SECONDS)
    assert Retry("later", delay=200 * 365 * 86400).delay == 200 * 365 * 86400


# -- one failure policy: the same doubling and the same "used up" rule everywhere ----------


@pytest.mark.parametrize("failures", [1, 2, 10, 1_025, 1_026, 10**6, 2**63])
def test_every_wait_of_the_inbox_is_the_same_capped_doubling(failures: int) -> None:
    from django_inbox.outbox.rows import backoff
    from django_inbox.processing.retry import ceiling

    policy = RetryPolicy(max_attempts=10, backoff_base=0.5, backoff_max=30.0, lease=60.0)
    assert policy.ceiling(failures) == ceiling(failures, 0.5, 30.0)
    with override_settings(INBOX_OUTBOX_BACKOFF_BASE=0.5, INBOX_OUTBOX_BACKOFF_MAX=30.0):
        assert all(0 <= backoff(failures) <= ceiling(failures, 0.5, 30.0) for _ in range(20))


def test_a_reconnect_backoff_without_jitter_doubles_to_its_cap_and_resets() -> None:
    from django_inbox.processing.retry import Backoff

    backoff = Backoff(0.5, 10.0, jitter=False)
    assert backoff.upcoming == 0.5
    assert [backoff.next() for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    backoff.reset()
    assert backoff.upcoming == 0.5 and backoff.next() == 0.5


def test_a_reconnect_backoff_with_jitter_waits_in_the_upper_half_of_its_ceiling() -> None:
    from django_inbox.processing.retry import Backoff

    random.seed(7)
    for _ in range(50):
        backoff = Backoff(0.5, 30.0)
        for failure in range(1, 12):
            upper = backoff.upcoming
            assert upper == min(30.0, 0.5 * 2 ** (failure - 1))
            assert upper / 2 <= backoff.next() <= upper
    backoff.failures = 2**63  # a process that lost its server for ever still waits, capped
    assert 15.0 <= backoff.next() <= 30.0


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "used"),
    [(0, 1, False), (1, 1, True), (4, 5, False), (5, 5, True), (6, 5, True), (2**31 - 1, 3, True)],
)
def test_attempts_are_used_up_at_the_maximum(attempts: int, max_attempts: int, used: bool) -> None:
    from django_inbox.processing.retry import used_up

    assert used_up(attempts, max_attempts) is used
    policy = RetryPolicy(max_attempts=max_attempts, backoff_base=1, backoff_max=1, lease=60.0)
    assert policy.used_up(attempts) is used
