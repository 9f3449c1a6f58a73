"""``check_exactly_once``: an effect counted after duplicates, a crash and a retry.
PYTEST_DONT_REWRITE."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, Unpack

from ..intake.message import MessageFields
from ..outcomes import Outcome
from .crash import simulate_crash

T = TypeVar("T")


def check_exactly_once(effect: Callable[[], T], **message: Unpack[MessageFields]) -> T:
    """Check that a handler's effect happens exactly once through a crash and a duplicate.

    The message is given as :func:`~django_inbox.deliver`'s keyword arguments; ``effect``
    reads the state the handler changes (a count, a balance, lines of a file)
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
    consumer, message_id = message["consumer"], message["message_id"]
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
    from ..intake.delivery import deliver

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
