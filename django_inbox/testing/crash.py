"""Crashes on demand: a handler's attempt that ends as if its process had died before the
inbox committed. PYTEST_DONT_REWRITE."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Unpack

from ..intake.message import MessageFields
from ..outcomes import Outcome
from ..registry import registry

if TYPE_CHECKING:
    from ..models import InboxMessage


class SimulatedCrash(BaseException):
    """The process "died" at the end of a handler's attempt, before the inbox committed.

    A ``BaseException`` (like ``KeyboardInterrupt``), not an ``Exception``: the inbox records
    handler exceptions as failures, but it must not record this one, because a process that
    dies records nothing. Every transaction it passes through rolls back, so the attempt's
    writes, the inbox row of a new message and the ``completed`` status all vanish, as they
    would when the database sees the connection of a killed process close.
    """


@dataclass
class CrashPlan:
    """What :func:`crash_after_handler` has done so far."""

    consumer: str
    event_type: str
    #: Crashes still to come.
    remaining: int
    #: Crashes so far: each is one handler call that ran to its end and was then cut off.
    crashes: int = 0


@contextmanager
def crash_after_handler(consumer: str, event_type: str, *, times: int = 1) -> Iterator[CrashPlan]:
    """Make the next ``times`` calls of a handler crash after the handler has run.

    The registered handler of ``(consumer, event_type)`` runs in full, inside the inbox's
    transaction; then :class:`SimulatedCrash` is raised before that transaction can commit
    (also when the handler raised: the process dies before the failure is recorded). Any
    code path that runs handlers is affected: :func:`~django_inbox.deliver`, the worker
    (:func:`run_worker`, ``inbox_process``), the broker consumer. The original handler is
    registered again when the block ends.

    Raises ``LookupError`` if no handler is registered for ``(consumer, event_type)``.
    """
    if isinstance(times, bool) or not isinstance(times, int) or times < 1:
        raise ValueError(f"times must be a positive integer, got {times!r}")
    original = registry.get(consumer, event_type)
    if original is None:
        raise LookupError(f"no handler is registered for {event_type!r} in consumer {consumer!r}")
    plan = CrashPlan(consumer=consumer, event_type=event_type, remaining=times)
    func = original.func

    @functools.wraps(func)  # keeps the handler's name, so the registry accepts the swap
    def crashing(message: InboxMessage) -> Any:
        try:
            return func(message)
        finally:
            if plan.remaining > 0:
                plan.remaining -= 1
                plan.crashes += 1
                raise SimulatedCrash(
                    f"simulated crash after {original.name} ran for message "
                    f"{message.message_id!r} (attempt {message.attempts})"
                )

    registry.register(replace(original, func=crashing))
    try:
        yield plan
    finally:
        current = registry.get(consumer, event_type)
        if current is not None and current.func is crashing:
            registry.register(original)


def simulate_crash(
    *, after_crash: Callable[[], object] | None = None, **message: Unpack[MessageFields]
) -> Outcome:
    """Deliver a new message whose first attempt dies before its commit, then redeliver it.
    The message is given as :func:`~django_inbox.deliver`'s keyword arguments.

    1. :func:`~django_inbox.deliver` runs the handler inside the inbox's transaction, and
       the process "dies" (:class:`SimulatedCrash`) after the handler returns (or raises),
       before the commit: everything rolls back, nothing is recorded.
    2. ``after_crash()`` is called, if given: assert there that nothing of the attempt
       is visible (a handler that writes outside the inbox's transaction fails here).
    3. The broker redelivers the message, flagged as redelivered
       (``deliver(..., redelivered=True)``): the inbox counts the lost attempt (a
       ``LostAttempt`` history entry), then runs the handler again as attempt 2.

    Returns the outcome of the redelivery: ``PROCESSED`` for a handler that succeeds, or
    what its failure made of attempt 2 (``FAILED``, ``DEAD``, ``PARKED``).

    Raises ``AssertionError`` if the inbox already has this message (a crash needs a first
    delivery that runs the handler: use a new message id) or if the handler did not run.
    Raises ``LookupError`` if no handler is registered for the message.
    """
    from ..conf import inbox_settings
    from ..intake.delivery import deliver
    from ..models import InboxMessage

    consumer, message_id = message["consumer"], message["message_id"]
    rows = InboxMessage.objects.using(inbox_settings.database)
    if rows.identified((consumer, message_id)).exists():
        raise AssertionError(
            f"simulate_crash() needs a message the inbox has not seen: {consumer}:{message_id} "
            "is already stored, so its delivery would not run the handler as a first attempt"
        )
    with crash_after_handler(consumer, message["event_type"]):
        try:
            outcome = deliver(**message)
        except SimulatedCrash:
            pass
        else:
            raise AssertionError(
                f"the handler did not run, so nothing crashed: deliver() returned {outcome}"
            )
    if after_crash is not None:
        after_crash()
    return deliver(**message, redelivered=True)
