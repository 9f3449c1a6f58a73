"""``collect()`` behind ``inbox_stats``: counts per consumer and status, and what looks wrong.

Three queries, each served by an index on PostgreSQL: one over the rows still to process
(the polled partial index), one over ``dead`` and ``parked`` rows (the attention partial
index), and one for ``completed`` rows, which on a large table is read from PostgreSQL's
estimate of the table size instead of counted (``exact=True`` counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q

from .. import clock, companions
from ..conf import inbox_settings
from ..db import statements
from ..models import ATTENTION_STATUSES, POLLED_STATUSES, InboxMessage
from ..ordered.gaps import GAP_PREFIX
from ..registry import registry
from .problems import PROBLEM_KINDS as PROBLEM_KINDS
from .problems import Problem as Problem
from .problems import consumer_problems, held_up, outbox_problems

Status = InboxMessage.Status
STATUSES = [str(status) for status in Status]

#: Above this many rows (PostgreSQL's estimate), completed rows are estimated, not counted
#: (``collect(estimate_above=…)`` overrides it; the admin's summary uses a lower threshold).
ESTIMATE_ABOVE = 1_000_000


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
    :data:`ESTIMATE_ABOVE`) and neither ``exact`` nor ``consumer`` is given: then their total
    is the estimate less the counted rows of the other statuses, and per-consumer
    ``completed`` counts are ``None``.
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
    polled = (
        rows.filter(status__in=POLLED_STATUSES)
        .values("consumer", "status")
        .annotate(
            n=Count("id"),
            first_due=Min("next_attempt_at"),
            first_received=Min("received_at"),
            stuck=Count("id", filter=Q(next_attempt_at__lt=now)),
        )
    )
    for row in polled:
        stats = of(row["consumer"])
        stats.counts[row["status"]] = row["n"]
        first = row["first_received"]
        if first and (
            stats.oldest_pending_received_at is None or first < stats.oldest_pending_received_at
        ):
            stats.oldest_pending_received_at = first
        if row["status"] == Status.IN_PROGRESS:
            stats.stuck = row["stuck"]
        elif row["first_due"] is not None and row["first_due"] <= now:
            age = (now - row["first_due"]).total_seconds()
            stats.oldest_pending_age = max(stats.oldest_pending_age, age)
    attention = (
        rows.filter(status__in=ATTENTION_STATUSES)
        .values("consumer", "status")
        .annotate(n=Count("id"), gaps=Count("id", filter=Q(last_error__startswith=GAP_PREFIX)))
    )
    for found_row in attention:
        stats = of(found_row["consumer"])
        stats.counts[found_row["status"]] = found_row["n"]
        if found_row["status"] == Status.PARKED:
            stats.parked_gaps = found_row["gaps"]
    # Ordered consumers' waiting rows: their own partial index (one IN list over the attention
    # and waiting statuses could not use both partial indexes).
    waiting = (
        rows.filter(status=Status.WAITING)
        .values("consumer")
        .annotate(n=Count("id"), since=Min("received_at"))
    )
    for waiting_row in waiting:
        stats = of(waiting_row["consumer"])
        stats.counts[Status.WAITING] = waiting_row["n"]
        if waiting_row["since"] is not None:
            stats.oldest_waiting_age = max(0.0, (now - waiting_row["since"]).total_seconds())

    held_up(rows, found, now - timedelta(seconds=max_pending_age), of)

    table_rows = 0 if exact or consumer is not None else estimated_rows(using)
    threshold = ESTIMATE_ABOVE if estimate_above is None else estimate_above
    estimated = table_rows > threshold
    if estimated:
        others = sum(
            s.pending
            + sum(s.counts[status] or 0 for status in (*ATTENTION_STATUSES, Status.WAITING))
            for s in found.values()
        )
        completed_total = max(table_rows - others, 0)
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
