"""Running the worker in a test until what is due is done. PYTEST_DONT_REWRITE."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from .. import clock
from ..outcomes import Outcome


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
    from ..services import process_due

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

    from ..conf import inbox_settings
    from ..models import InboxMessage

    if not failed and not leases:
        return
    now = clock.now()
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
