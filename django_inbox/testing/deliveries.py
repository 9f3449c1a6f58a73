"""Delivering one message several times, as an at-least-once broker does. PYTEST_DONT_REWRITE."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..outcomes import Outcome


def deliver_times(
    n: int,
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
) -> list[Outcome]:
    """Deliver the same message ``n`` times with :func:`~django_inbox.deliver`; the outcomes.

    A handler that succeeds gives ``[PROCESSED, DUPLICATE, DUPLICATE, …]``. A failure is
    recorded and retried by the next delivery only once its backoff has passed (before that
    a delivery reports the row's status, ``FAILED``); see :func:`run_worker` to force it.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    from ..delivery import deliver

    return [
        deliver(
            consumer=consumer,
            message_id=message_id,
            event_type=event_type,
            payload=payload,
            headers=headers,
            source=source,
            key=key,
        )
        for _ in range(n)
    ]


def deliver_twice(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
) -> tuple[Outcome, Outcome]:
    """Deliver the same message twice, as a broker does after a lost acknowledgement.

    Returns both outcomes: ``(PROCESSED, DUPLICATE)`` for a handler that succeeds. Assert
    afterwards that the handler's effect happened once. The second delivery never runs the
    handler, so this proves your consumer name and message id are stable; it cannot catch a
    handler that writes outside the inbox's transaction: :func:`simulate_crash` does.
    """
    first, second = deliver_times(
        2,
        consumer=consumer,
        message_id=message_id,
        event_type=event_type,
        payload=payload,
        headers=headers,
        source=source,
        key=key,
    )
    return first, second
