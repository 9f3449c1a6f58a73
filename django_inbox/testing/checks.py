"""``check_exactly_once``: an effect counted after duplicates, a crash and a retry.
PYTEST_DONT_REWRITE."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ..outcomes import Outcome
from .crash import simulate_crash

T = TypeVar("T")


def check_exactly_once(
    effect: Callable[[], T],
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
) -> T:
    """Check that a handler's effect happens exactly once through a crash and a duplicate.

    ``effect`` reads the state the handler changes (a count, a balance, lines of a file)
    and returns something comparable with ``==``. The check runs :func:`simulate_crash` on
    the message (use a new message id), then delivers it once more, and raises
    ``AssertionError`` unless:

    - the crashed attempt left ``effect()`` unchanged (nothing half-done: a handler that
      writes outside the inbox's transaction, to another database, a file or an API, fails
      here);
    - the redelivery returned ``PROCESSED`` and changed ``effect()``;
    - the duplicate delivery returned ``DUPLICATE`` and left ``effect()`` unchanged.

    Returns ``effect()`` after the message was processed, for your own assertion of its
    exact value.
    """
    message: dict[str, Any] = {
        "consumer": consumer,
        "message_id": message_id,
        "event_type": event_type,
        "payload": payload,
        "headers": headers,
        "source": source,
        "key": key,
    }
    before = effect()

    def nothing_half_done() -> None:
        during = effect()
        if during != before:
            raise AssertionError(
                f"the crashed attempt of {consumer}:{message_id} left an effect behind "
                f"({before!r} -> {during!r}): the handler writes outside the inbox's "
                "transaction, so a crash before the commit keeps it and the redelivery "
                "repeats it"
            )

    outcome = simulate_crash(**message, after_crash=nothing_half_done)
    if outcome != Outcome.PROCESSED:
        raise AssertionError(f"the redelivery after the crash returned {outcome}, not processed")
    once = effect()
    if once == before:
        raise AssertionError(
            f"processing {consumer}:{message_id} did not change the effect ({before!r}): "
            "pass an effect that reads what the handler writes"
        )
    from ..delivery import deliver

    duplicate = deliver(**message)
    if duplicate != Outcome.DUPLICATE:
        raise AssertionError(f"delivering the message again returned {duplicate}, not duplicate")
    again = effect()
    if again != once:
        raise AssertionError(
            f"the duplicate delivery of {consumer}:{message_id} changed the effect "
            f"({once!r} -> {again!r})"
        )
    return once
