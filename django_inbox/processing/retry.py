"""The failure policy, defined once: how long a failed attempt waits, and when attempts are
used up.

Everything that waits after a failure computes its wait here: a handler's failed attempt
(:class:`RetryPolicy`), an outbox row the broker refused (``outbox.rows.fail``), and the
reconnects of long-running processes to a database or a broker (:class:`Backoff`). Everything
that gives a row up after its attempts asks :func:`used_up`: a handler's failure, a worker
that died holding the row (take-over), and the outbox's relay.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..conf import inbox_settings
from ..registry import Handler

#: The doubling stops here: ``2.0 ** 1000`` is a float, an ``int`` power of two past 1,024
#: bits is not one (``OverflowError``), and every cap is far below it anyway.
MAX_DOUBLINGS = 1000


def ceiling(failures: int, base: float, cap: float) -> float:
    """The longest wait after failure number ``failures`` (1-based): ``base`` doubling with
    each failure, never over ``cap``, for any number of failures."""
    return min(cap, base * 2.0 ** min(max(failures - 1, 0), MAX_DOUBLINGS))


def full_jitter(upper: float, rng: random.Random | None = None) -> float:
    """Uniform in ``[0, upper]``: spreads the retries of many rows that failed together (a
    downstream outage) instead of sending them back in synchronised waves."""
    return (rng or random).uniform(0, upper)


def used_up(attempts: int, max_attempts: int) -> bool:
    """Whether a row that has made ``attempts`` attempts may make no more: it is ``dead``."""
    return attempts >= max_attempts


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
        return ceiling(attempt, self.backoff_base, self.backoff_max)

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Exponential backoff with full jitter: uniform in ``[0, ceiling(attempt)]``."""
        return full_jitter(self.ceiling(attempt), rng)

    def used_up(self, attempts: int) -> bool:
        return used_up(attempts, self.max_attempts)


class Backoff:
    """Waits between a long-running process's reconnects: ``base`` doubling to ``cap``.

    With ``jitter`` (the default) a wait is uniform in the upper half of its ceiling, so
    processes that lost the same server do not come back in step, and never wait less than
    half of it; without, the ceiling itself (a relay's log line says the wait before it waits).
    """

    def __init__(self, base: float = 0.5, cap: float = 30.0, *, jitter: bool = True) -> None:
        self.base, self.cap, self.jitter, self.failures = base, cap, jitter, 0

    @property
    def upcoming(self) -> float:
        """The ceiling of the next wait."""
        return ceiling(self.failures + 1, self.base, self.cap)

    def next(self) -> float:
        upper = self.upcoming
        self.failures += 1
        return upper / 2 + full_jitter(upper / 2) if self.jitter else upper

    def reset(self) -> None:
        self.failures = 0
