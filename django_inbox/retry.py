"""Retry policy: how long a failed message waits, and when it is given up."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .conf import inbox_settings
from .registry import Handler


@dataclass(frozen=True)
class RetryPolicy:
    """The effective policy for one handler: handler arguments over consumer over global."""

    max_attempts: int
    backoff_base: float
    backoff_max: float
    lease: float

    @classmethod
    def for_handler(cls, consumer: str, handler: Handler | None) -> RetryPolicy:
        policy = inbox_settings.policy(consumer)
        if handler is None:
            return cls(policy.max_attempts, policy.backoff_base, policy.backoff_max, policy.lease)
        return cls(
            max_attempts=handler.max_attempts or policy.max_attempts,
            backoff_base=(
                policy.backoff_base if handler.backoff_base is None else handler.backoff_base
            ),
            backoff_max=policy.backoff_max if handler.backoff_max is None else handler.backoff_max,
            lease=policy.lease,
        )

    def ceiling(self, attempt: int) -> float:
        """The longest delay after failed attempt number ``attempt`` (1-based)."""
        if attempt >= 64:
            return self.backoff_max
        return min(self.backoff_max, self.backoff_base * 2.0 ** max(attempt - 1, 0))

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Exponential backoff with full jitter: uniform in ``[0, ceiling(attempt)]``.

        Full jitter spreads retries of many messages that failed together (a downstream
        outage) instead of sending them back in synchronised waves.
        """
        return (rng or random).uniform(0, self.ceiling(attempt))
