"""Delivering one message several times, as an at-least-once broker does. PYTEST_DONT_REWRITE."""

from __future__ import annotations

from typing import Unpack

from ..intake.message import MessageFields
from ..outcomes import Outcome


def deliver_times(n: int, **message: Unpack[MessageFields]) -> list[Outcome]:
    """Deliver the same message ``n`` times with :func:`~django_inbox.deliver`; the outcomes.
    The message is given as ``deliver()``'s keyword arguments.

    A handler that succeeds gives ``[PROCESSED, DUPLICATE, DUPLICATE, …]``. A failure is
    recorded and retried by the next delivery only once its backoff has passed (before that
    a delivery reports the row's status, ``FAILED``); see :func:`run_worker` to force it.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    from ..intake.delivery import deliver

    return [deliver(**message) for _ in range(n)]


def deliver_twice(**message: Unpack[MessageFields]) -> tuple[Outcome, Outcome]:
    """Deliver the same message twice, as a broker does after a lost acknowledgement.

    Returns both outcomes: ``(PROCESSED, DUPLICATE)`` for a handler that succeeds. Assert
    afterwards that the handler's effect happened once. The second delivery never runs the
    handler, so this proves your consumer name and message id are stable; it cannot catch a
    handler that writes outside the inbox's transaction: :func:`simulate_crash` does.
    """
    first, second = deliver_times(2, **message)
    return first, second
