"""The counts behind :func:`~django_inbox.services.stats.collect`, bounded on large tables.

Three families of rows, each with a partial index of its own on PostgreSQL: those still to
process (``received``, ``failed``, ``in_progress``), those that need an operator (``dead``,
``parked``) and ordered consumers' ``waiting`` rows. Each family is first counted through its
index alone, up to :data:`~django_inbox.db.counting.EXACT_UP_TO` + 1 entries: when no more,
one read of its rows gives every exact number, as in a healthy inbox. Otherwise each consumer
is counted the same way up to :data:`~django_inbox.db.counting.EXACT_PER_CONSUMER` + 1 and
read when no more; a consumer with more has its first rows read (in due order; the newest dead
and parked ones) and the planner's estimates for the statuses met among them (never less than
what was read), marked in ``ConsumerStats.estimated``. In a large backlog, ``in_progress`` and
``failed`` rows are read through their own indexes (few, and exact), and ``received`` ones are
the rest of a consumer's polled rows. The oldest due age stays exact (rows are read in due
order); the waiting age is approximate beyond the limits.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connections
from django.db.models import QuerySet

from ..db.counting import (
    EXACT_PER_CONSUMER,
    Sample,
    bounded_count,
    bounded_counts,
    estimate,
    estimates,
    firsts,
    sample,
)
from ..models import ATTENTION_STATUSES, POLLED_STATUSES, InboxMessage
from ..ordered.gaps import GAP_PREFIX

if TYPE_CHECKING:
    from .stats import ConsumerStats

Status = InboxMessage.Status
Rows = QuerySet[InboxMessage]
Of = Callable[[str], "ConsumerStats"]
#: The consumers to sample one by one, asked only when a family is over the limit.
Names = Callable[[], Iterable[str]]
#: Databases whose planner estimates a query's rows (:func:`~django_inbox.db.counting.estimate`).
PLANNED = ("postgresql", "mysql")


def tally(rows: Rows, now: datetime, limit: int | None, consumers: Names, of: Of) -> None:
    """Fill each consumer's counts, ages, stuck rows and parked gaps (``of(name)`` gives a
    consumer's stats); ``limit=None`` counts every row. ``consumers()`` names the consumers
    to sample one by one when a family has more rows than the limit."""
    _polled(rows, now, limit, consumers, of)
    _attention(rows, limit, consumers, of)
    _waiting(rows, now, limit, consumers, of)


def _quote(rows: Rows, name: str) -> str:
    return f"s.{connections[rows.db].ops.quote_name(name)}"


def _at(rows: Rows, when: datetime) -> Any:
    return connections[rows.db].ops.adapt_datetimefield_value(when)


def _families(
    rows: Rows,
    statuses: Sequence[str],
    limit: int | None,
    consumers: Names,
    read: Callable[..., Sample],
    fill: Callable[[dict[str, Any]], None],
    of: Of,
    *,
    due_order: str,
    count_first: bool = False,
) -> None:
    """Count ``statuses`` of every consumer: read up to ``limit`` + 1 rows, or with
    ``count_first`` counted through the index alone up to ``limit`` (index entries, no row)
    and then read whole when no more (exact). Otherwise each consumer is
    counted the same way up to :data:`EXACT_PER_CONSUMER` and read when no more. A consumer
    over that has its first :data:`EXACT_PER_CONSUMER` + 1 rows in ``due_order`` read (its
    ages; for dead and parked rows, the newest), and each status met among them estimated;
    a status not met keeps its count of ``0``, marked as an estimate too. Reading a row (its
    status, ages, error) visits the table, scattered over it when rows are old: the counts
    never do."""
    family = rows.filter(status__in=statuses)
    if limit is None or (
        count_first and bounded_count(family, limit=limit, guess=False)[0] <= limit
    ):
        for group in read(family, ()).groups:
            fill(group)
        return
    if not count_first:  # recent rows, usually few: reading them is the count
        whole = read(family, ())
        if whole.complete:
            for group in whole.groups:
                fill(group)
            return
    names = list(consumers())
    counted = bounded_counts(family, names, limit=EXACT_PER_CONSUMER)
    for name in names:
        if not counted[name]:
            continue
        found = read(family.filter(consumer=name), (due_order,), EXACT_PER_CONSUMER)
        for group in found.groups:
            fill(group)
        if counted[name] <= EXACT_PER_CONSUMER:
            continue
        if connections[rows.db].vendor not in PLANNED:  # no estimates (SQLite): count them
            _estimate(rows, name, statuses, of)
            continue
        met = {group["status"] for group in found.groups}
        _estimate(rows, name, [status for status in statuses if status in met], of)
        of(name).estimated.update(statuses)


def _estimate(rows: Rows, name: str, statuses: Sequence[str], of: Of) -> None:
    """Replace the read counts of ``name``'s ``statuses`` by the planner's estimates, never
    lower (on SQLite, which has none, by counts)."""
    stats = of(name)
    for status in statuses:
        guess = estimate(rows.filter(consumer=name, status=status))
        read = stats.counts[status] or 0
        if guess is None:  # no planner: count (SQLite)
            stats.counts[status] = rows.filter(consumer=name, status=status).count()
            continue
        stats.counts[status] = max(guess, read)
        stats.estimated.add(status)


def _polled(rows: Rows, now: datetime, limit: int | None, consumers: Names, of: Of) -> None:
    stuck = f"{_quote(rows, 'status')} = %s AND {_quote(rows, 'next_attempt_at')} < %s"

    def read(selected: Rows, order: Sequence[str], most: int | None = limit) -> Sample:
        return sample(
            selected,
            ("consumer", "status"),
            {
                "first_due": ("min", "next_attempt_at"),
                "first_received": ("min", "received_at"),
                "stuck": ("sum_if", stuck),
            },
            limit=None if limit is None else most,
            order_by=order,
            columns=("next_attempt_at",),
            params=[Status.IN_PROGRESS, _at(rows, now)],
        )

    def fill(group: dict[str, Any]) -> None:
        stats = of(group["consumer"])
        stats.counts[group["status"]] = int(group["n"])
        first = group["first_received"]
        if first and (
            stats.oldest_pending_received_at is None or first < stats.oldest_pending_received_at
        ):
            stats.oldest_pending_received_at = first
        if group["status"] == Status.IN_PROGRESS:
            stats.stuck = int(group["stuck"])
        elif group["first_due"] is not None and group["first_due"] <= now:
            age = (now - group["first_due"]).total_seconds()
            stats.oldest_pending_age = max(stats.oldest_pending_age, age)

    polled = rows.filter(status__in=POLLED_STATUSES)
    if limit is None or bounded_count(polled, limit=limit, guess=False)[0] <= limit:
        for group in read(polled, ()).groups:
            fill(group)
        return
    # A large backlog. In-progress rows (by lease) and failed rows (by due time) have their
    # own indexes, and are few: sampled apart. Received rows are the rest of a consumer's
    # polled rows, counted through the polled index alone (up to the limit).
    for status in (Status.IN_PROGRESS, Status.FAILED):
        _families(rows, (status,), limit, consumers, read, fill, of, due_order="next_attempt_at")
    _received(
        rows, list(consumers()), now, min(limit, EXACT_PER_CONSUMER), of
    )  # those with rows included


def _received(rows: Rows, names: list[str], now: datetime, limit: int, of: Of) -> None:
    """Consumers' received rows in a large backlog: each one's polled rows counted up to the
    limit less its in-progress and failed ones (known), or estimated; its oldest due by one
    probe of the polled index (exact: the received row with the earliest due time). Two round
    trips for all consumers, and an estimate for each consumer over the limit."""
    polled = bounded_counts(rows.filter(status__in=POLLED_STATUSES), names, limit=limit)
    received = rows.filter(status=Status.RECEIVED)
    first = firsts(received, names, ("next_attempt_at", "received_at"), ("next_attempt_at",))
    over = [name for name in names if polled[name] > limit]
    guesses = estimates(received, over)
    for name in names:
        stats = of(name)
        others = (stats.counts[Status.IN_PROGRESS] or 0) + (stats.counts[Status.FAILED] or 0)
        if polled[name] <= limit:
            stats.counts[Status.RECEIVED] = max(polled[name] - others, 0)
        elif guesses[name] is None:  # no planner estimate (SQLite): count
            stats.counts[Status.RECEIVED] = received.filter(consumer=name).count()
        else:
            stats.counts[Status.RECEIVED] = max(guesses[name] or 0, polled[name] - others)
            stats.estimated.add(Status.RECEIVED)
        if name not in first:
            continue
        due, arrived = first[name]
        if arrived and (
            stats.oldest_pending_received_at is None or arrived < stats.oldest_pending_received_at
        ):
            stats.oldest_pending_received_at = arrived
        if due is not None and due <= now:
            stats.oldest_pending_age = max(stats.oldest_pending_age, (now - due).total_seconds())


def _attention(rows: Rows, limit: int | None, consumers: Names, of: Of) -> None:
    gap = f"{_quote(rows, 'last_error')} LIKE %s"

    def read(selected: Rows, order: Sequence[str], most: int | None = limit) -> Sample:
        return sample(
            selected,
            ("consumer", "status"),
            {"gaps": ("sum_if", gap)},
            limit=None if limit is None else most,
            order_by=order,
            columns=("last_error",),
            params=[f"{GAP_PREFIX}%"],
        )

    def fill(group: dict[str, Any]) -> None:
        stats = of(group["consumer"])
        stats.counts[group["status"]] = int(group["n"])
        if group["status"] == Status.PARKED:
            stats.parked_gaps = int(group["gaps"])

    # The newest first: a consumer's latest failures are among the rows read.
    # Counted through the index first: dead rows are old and scattered over the table, and
    # reading 10,001 of them cost 0.1 s at 10M rows.
    _families(
        rows,
        ATTENTION_STATUSES,
        limit,
        consumers,
        read,
        fill,
        of,
        due_order="-updated_at",
        count_first=True,
    )


def _waiting(rows: Rows, now: datetime, limit: int | None, consumers: Names, of: Of) -> None:
    def read(selected: Rows, order: Sequence[str], most: int | None = limit) -> Sample:
        return sample(
            selected,
            ("consumer", "status"),
            {"since": ("min", "received_at")},
            limit=None if limit is None else most,
            order_by=order,
        )

    def fill(group: dict[str, Any]) -> None:
        stats = of(group["consumer"])
        stats.counts[Status.WAITING] = int(group["n"])
        if group["since"] is not None:
            age = max(0.0, (now - group["since"]).total_seconds())
            stats.oldest_waiting_age = max(stats.oldest_waiting_age, age)

    _families(
        rows, (Status.WAITING,), limit, consumers, read, fill, of, due_order="next_attempt_at"
    )
