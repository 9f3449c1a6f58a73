"""Helpers for testing your own handlers: deliver twice, crash before the commit, run the worker.

Each helper goes through the inbox's real code paths (:func:`django_inbox.deliver`, the
worker's claim and lease); nothing is re-implemented or mocked. Use them from any test that
may use the database::

    from django_inbox.testing import deliver_twice, simulate_crash, run_worker

or, with pytest, load the fixtures in your ``conftest.py``::

    pytest_plugins = ["django_inbox.testing"]

and ask for the ``inbox`` fixture. Importing this module does not need pytest, and does not
need the app registry either (Django's modules are loaded on first use).

They work in ``transaction=True`` tests (``TransactionTestCase``), where every transaction
really commits, and in plain ``django_db`` tests (``TestCase``), where the inbox's
transactions are savepoints inside the test's transaction: see the how-to "Test your
handlers" for what differs.

The helpers raise their ``AssertionError`` themselves (they use no ``assert`` statement), so
pytest need not rewrite this module: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import timedelta
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, TypeVar

from .outcomes import Outcome
from .registry import registry

if TYPE_CHECKING:
    from .models import InboxMessage

__all__ = [
    "CrashPlan",
    "Inbox",
    "SimulatedCrash",
    "check_exactly_once",
    "crash_after_handler",
    "deliver_times",
    "deliver_twice",
    "run_worker",
    "simulate_crash",
]

T = TypeVar("T")


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
    from .delivery import deliver

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


def simulate_crash(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
    after_crash: Callable[[], object] | None = None,
) -> Outcome:
    """Deliver a new message whose first attempt dies before its commit, then redeliver it.

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
    from .conf import inbox_settings
    from .delivery import deliver
    from .models import InboxMessage

    message: dict[str, Any] = {
        "consumer": consumer,
        "message_id": message_id,
        "event_type": event_type,
        "payload": payload,
        "headers": headers,
        "source": source,
        "key": key,
    }
    rows = InboxMessage.objects.using(inbox_settings.database)
    if rows.filter(consumer=consumer, message_id=message_id).exists():
        raise AssertionError(
            f"simulate_crash() needs a message the inbox has not seen: {consumer}:{message_id} "
            "is already stored, so its delivery would not run the handler as a first attempt"
        )
    with crash_after_handler(consumer, event_type):
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


def run_worker(
    consumers: list[str] | None = None,
    *,
    due_now: bool = False,
    expire_leases: bool = False,
    settle: bool = False,
    max_messages: int | None = 1000,
) -> Counter[Outcome]:
    """Process the stored messages that are due, as ``manage.py inbox_process`` would.

    A thin layer over :func:`django_inbox.services.process_due`, run in the test's process
    and database connection. Returns how many messages ended each way, e.g.
    ``Counter({Outcome.PROCESSED: 2, Outcome.FAILED: 1})`` (compare it with a ``dict``).

    Args:
        consumers: the consumers to serve; every consumer with a handler when ``None``.
        due_now: first make ``failed`` messages due now, instead of after their backoff.
        expire_leases: first end the leases of ``in_progress`` messages, as if their
            worker had died (after a :class:`SimulatedCrash` in the worker, say). The next
            claim takes them over and counts the lost attempt (``LeaseExpired``). Only for
            tests where no other worker is running.
        settle: repeat (making ``failed`` messages due each time) until nothing is due, so
            every message ends ``completed``, ``dead`` or ``parked``. Outcomes of all rounds
            are added up; ``max_messages`` applies to each round.
        max_messages: stop a round after this many messages (``None``: no limit).
    """
    from .services import process_due

    outcomes: Counter[Outcome] = Counter()
    for _ in range(_MAX_ROUNDS):
        _make_due(consumers, failed=due_now or settle, leases=expire_leases)
        stats = process_due(consumers, max_messages=max_messages)
        for value, count in stats.outcomes.items():
            outcomes[Outcome(value)] += count
        if not settle or not stats.handled:
            return outcomes
    raise AssertionError(
        f"run_worker(settle=True) still found messages due after {_MAX_ROUNDS} rounds: "
        f"{dict(outcomes)}"
    )


#: A bound on ``run_worker(settle=True)``: each round counts an attempt of every message it
#: handles, so ``max_attempts`` ends any message long before.
_MAX_ROUNDS = 100


def _make_due(consumers: list[str] | None, *, failed: bool, leases: bool) -> None:
    from django.utils import timezone

    from .conf import inbox_settings
    from .models import InboxMessage

    if not failed and not leases:
        return
    now = timezone.now()
    rows = InboxMessage.objects.using(inbox_settings.database)
    if consumers:
        rows = rows.filter(consumer__in=consumers)
    if failed:
        rows.filter(status=InboxMessage.Status.FAILED, next_attempt_at__gt=now).update(
            next_attempt_at=now
        )
    if leases:
        # A second in the past: claims take over rows whose lease ended *before* their now.
        ended = now - timedelta(seconds=1)
        rows.filter(status=InboxMessage.Status.IN_PROGRESS).update(
            next_attempt_at=ended, locked_until=ended
        )


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
    from .delivery import deliver

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


class Inbox:
    """The helpers of this module as methods, plus lookups: what the ``inbox`` fixture gives."""

    deliver_times = staticmethod(deliver_times)
    deliver_twice = staticmethod(deliver_twice)
    simulate_crash = staticmethod(simulate_crash)
    crash_after_handler = staticmethod(crash_after_handler)
    run_worker = staticmethod(run_worker)
    check_exactly_once = staticmethod(check_exactly_once)

    @property
    def deliver(self) -> Callable[..., Outcome]:
        """:func:`django_inbox.deliver` (imported when first used, so this module imports
        before Django is set up)."""
        from .delivery import deliver

        return deliver

    @property
    def store(self) -> Callable[..., bool]:
        """:func:`django_inbox.store`: keep the message for :meth:`run_worker`."""
        from .storing import store

        return store

    @staticmethod
    def row(consumer: str, message_id: str) -> InboxMessage:
        """The inbox row of a message, read now (``InboxMessage.DoesNotExist`` if none)."""
        from .conf import inbox_settings
        from .models import InboxMessage

        return InboxMessage.objects.using(inbox_settings.database).get(
            consumer=consumer, message_id=message_id
        )

    @staticmethod
    def errors(consumer: str, message_id: str) -> list[str]:
        """The ``type`` of each failed attempt in the message's history, oldest first."""
        return [entry["type"] for entry in Inbox.row(consumer, message_id).errors]


if find_spec("pytest") is not None:  # the fixture, for pytest_plugins = ["django_inbox.testing"]
    import pytest

    @pytest.fixture
    def inbox(db: None) -> Inbox:
        """The testing helpers, with database access.

        The test's ``django_db`` mark decides the kind of access: with
        ``@pytest.mark.django_db(transaction=True)`` every inbox transaction commits;
        without, the test runs inside one transaction, as in a ``TestCase``.
        """
        return Inbox()
