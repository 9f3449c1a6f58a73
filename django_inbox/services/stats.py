"""``collect()`` behind ``inbox_stats``, the health view, the metrics and the admin's summary:
counts per consumer and status, and what looks wrong.

Every read is bounded, so that the answer stays fast in an incident, when the table holds
millions of rows and the backlog hundreds of thousands: the rows to process, the dead and
parked rows and the waiting rows are counted through their partial indexes up to a limit and
estimated beyond it (:mod:`~django_inbox.services.tallies`), and ``completed`` rows, on a large
table, are read from the database's estimate of the table size (``exact=True`` counts all).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from .. import clock, companions
from ..conf import inbox_settings
from ..db import statements
from ..db.counting import EXACT_UP_TO, estimate
from ..models import ATTENTION_STATUSES, POLLED_STATUSES, InboxMessage
from ..registry import registry
from .problems import PROBLEM_KINDS as PROBLEM_KINDS
from .problems import Problem as Problem
from .problems import consumer_problems, held_up, outbox_problems
from .tallies import tally

Status = InboxMessage.Status
STATUSES = [str(status) for status in Status]

#: Above this many rows (the database's estimate), completed rows are estimated, not counted
#: (``collect(estimate_above=…)`` overrides it).
ESTIMATE_ABOVE = 100_000


@dataclass
class ConsumerStats:
    consumer: str
    #: Rows per status; ``completed`` is ``None`` when only a total estimate is known.
    counts: dict[str, int | None] = field(default_factory=lambda: dict.fromkeys(STATUSES, 0))
    #: ``in_progress`` rows whose lease expired: their worker died or hangs.
    stuck: int = 0
    #: Seconds the longest-waiting due row (``received``, or ``failed`` past its backoff) has
    #: waited for a worker; ``0`` when nothing is due.
    oldest_pending_age: float = 0.0
    #: When the oldest row still to process (``received``/``failed``/``in_progress``) arrived.
    oldest_pending_received_at: datetime | None = None
    #: Ordered consumers: seconds since the oldest ``waiting`` row arrived.
    oldest_waiting_age: float = 0.0
    #: Ordered consumers: ``parked`` rows whose gap outlived ``gap_timeout``.
    parked_gaps: int = 0
    #: Ordered consumers: keys held up until an operator acts (a version parked for a gap, or
    #: waiting versions behind a ``dead`` or ``parked`` one).
    stalled_keys: int = 0
    #: Ordered consumers: ``waiting`` rows whose gap deadline passed longer than
    #: ``max_pending_age`` ago (no worker sweeps them).
    overdue_waiting: int = 0
    #: Statuses whose count is the database's estimate: more than
    #: :data:`~django_inbox.db.counting.EXACT_UP_TO` rows, not counted one by one.
    estimated: set[str] = field(default_factory=set)

    @property
    def pending(self) -> int:
        return sum(self.counts[s] or 0 for s in POLLED_STATUSES)


@dataclass
class InboxStats:
    at: datetime
    consumers: dict[str, ConsumerStats]
    problems: list[Problem]
    #: Total ``completed`` rows, estimated when :attr:`completed_estimated`.
    completed_total: int
    completed_estimated: bool
    max_pending_age: float
    #: The outbox's state, when ``django_inbox.outbox`` is installed.
    outbox: Any = None

    @property
    def healthy(self) -> bool:
        return not self.problems

    def totals(self) -> dict[str, int]:
        totals = dict.fromkeys(STATUSES, 0)
        for consumer in self.consumers.values():
            for status, count in consumer.counts.items():
                totals[status] += count or 0
        totals[Status.COMPLETED] = self.completed_total
        return totals

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready form (what ``inbox_stats --json`` prints)."""
        return {
            "at": self.at.isoformat(),
            "healthy": self.healthy,
            "problems": [vars(problem) for problem in self.problems],
            "max_pending_age": self.max_pending_age,
            "totals": self.totals(),
            "completed_estimated": self.completed_estimated,
            "outbox": (
                None
                if self.outbox is None
                else {
                    "pending": self.outbox.pending,
                    "sent": self.outbox.sent,
                    "dead": self.outbox.dead,
                    "oldest_pending_age": round(self.outbox.oldest_pending_age, 3),
                    "last_sent_age": (
                        None
                        if self.outbox.last_sent_age is None
                        else round(self.outbox.last_sent_age, 3)
                    ),
                    "unclaimed_for": round(self.outbox.unclaimed_for, 3),
                    "last_failure": self.outbox.last_failure,
                    "estimated": [
                        name
                        for name in ("pending", "sent", "dead")
                        if getattr(self.outbox, f"{name}_estimated")
                    ],
                }
            ),
            "consumers": {
                name: {
                    "counts": consumer.counts,
                    "pending": consumer.pending,
                    "stuck": consumer.stuck,
                    "oldest_pending_age": round(consumer.oldest_pending_age, 3),
                    "oldest_pending_received_at": (
                        consumer.oldest_pending_received_at.isoformat()
                        if consumer.oldest_pending_received_at
                        else None
                    ),
                    "oldest_waiting_age": round(consumer.oldest_waiting_age, 3),
                    "parked_gaps": consumer.parked_gaps,
                    "estimated": sorted(consumer.estimated),
                }
                for name, consumer in sorted(self.consumers.items())
            },
        }


def collect(
    *,
    consumer: str | None = None,
    max_pending_age: float | None = None,
    ignore: tuple[str, ...] = (),
    exact: bool = False,
    estimate_above: int | None = None,
) -> InboxStats:
    """Count the inbox's rows and list its problems.

    Problems: ``dead`` rows exist; ``stuck`` rows (``in_progress`` past their lease) exist;
    a due row has waited longer than ``max_pending_age`` seconds (``INBOX_MAX_PENDING_AGE``)
    for a worker. Kinds named in ``ignore`` are not reported.

    ``completed`` rows are counted (a scan of the table) unless the database (PostgreSQL,
    MariaDB or MySQL) estimates the table above ``estimate_above`` rows (default
    :data:`ESTIMATE_ABOVE`) and ``exact`` is not given: then their total is the estimate less
    the counted rows of the other statuses (with ``consumer``, the planner's estimate of its
    completed rows), and per-consumer ``completed`` and ``skipped`` counts are ``None``.

    The other statuses are counted exactly up to
    :data:`~django_inbox.db.counting.EXACT_UP_TO` rows of each family (rows to process, dead
    and parked, waiting), and beyond that, per consumer, up to
    :data:`~django_inbox.db.counting.EXACT_PER_CONSUMER`; larger counts are the planner's
    estimates, named in ``ConsumerStats.estimated`` (:mod:`~django_inbox.services.tallies`).
    ``exact=True`` counts every row.
    """
    using = inbox_settings.database
    now = clock.now()
    if max_pending_age is None:
        max_pending_age = inbox_settings.max_pending_age
    rows = InboxMessage.objects.using(using).for_consumer(consumer).order_by()
    found: dict[str, ConsumerStats] = {}

    def of(name: str) -> ConsumerStats:
        return found.setdefault(name, ConsumerStats(name))

    for name in registry.consumers() if consumer is None else [consumer]:
        of(name)
    tally(
        rows,
        now,
        None if exact else EXACT_UP_TO,
        lambda: known_consumers() if consumer is None else [consumer],
        of,
    )

    held_up(rows, found, now - timedelta(seconds=max_pending_age), of)

    table_rows = 0 if exact else estimated_rows(using)
    threshold = ESTIMATE_ABOVE if estimate_above is None else estimate_above
    estimated = table_rows > threshold
    if estimated:
        if consumer is None:
            others = sum(
                s.pending
                + sum(s.counts[status] or 0 for status in (*ATTENTION_STATUSES, Status.WAITING))
                for s in found.values()
            )
            completed_total = max(table_rows - others, 0)
        else:  # the planner's estimate of this consumer's completed rows
            completed_total = estimate(rows.filter(status=Status.COMPLETED)) or 0
        for stats in found.values():
            stats.counts[Status.COMPLETED] = None
            stats.counts[Status.SKIPPED] = None  # counted with completed in the estimate
    else:
        completed_total = 0
        completed = (
            rows.filter(status__in=(Status.COMPLETED, Status.SKIPPED))
            .values("consumer", "status")
            .annotate(n=Count("id"))
        )
        for count in completed:
            of(count["consumer"]).counts[count["status"]] = count["n"]
            if count["status"] == Status.COMPLETED:
                completed_total += count["n"]
    problems = consumer_problems(found, max_pending_age, ignore)
    outbox = _outbox(now) if consumer is None else None
    if outbox is not None:
        problems += outbox_problems(outbox, max_pending_age, ignore)
    return InboxStats(
        at=now,
        consumers=found,
        problems=problems,
        completed_total=completed_total,
        completed_estimated=estimated,
        max_pending_age=max_pending_age,
        outbox=outbox,
    )


def _outbox(now: datetime) -> Any:
    """The outbox's stats, when ``django_inbox.outbox`` is installed."""
    outbox = companions.outbox()
    return None if outbox is None else outbox.collect(now)


def estimated_rows(using: str, table: str | None = None) -> int:
    """The database's estimate of the rows of ``table``, the inbox's by default (see
    :func:`~django_inbox.db.statements.estimated_rows`); ``0`` on SQLite."""
    return statements.estimated_rows(using, table)


def known_consumers() -> list[str]:
    """Consumers with handlers or a policy, and any that have rows (an index walk, no scan)."""
    names = set(registry.consumers()) | set(inbox_settings.consumers)
    names.update(distinct_consumers())
    return sorted(names)


def distinct_consumers(using: str | None = None) -> list[str]:
    """Every consumer that has rows, without a scan (a loose index scan on PostgreSQL)."""
    return statements.distinct_consumers(using or inbox_settings.database)
