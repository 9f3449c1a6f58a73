"""The outbox's state for ``inbox_stats``, the health view and the metrics: counts, the relay's
lag, and, when pending rows wait too long, why: nothing claims them (is a relay running?), or
relays claim them and every attempt fails (the broker returns or refuses them), or relays send
and are behind.

Each query reads an index: pending and dead rows are counted over their partial indexes (up to
10,000 each, estimated beyond), the
last ``sent_at`` is the end of the sent rows' index, and the rows due first the start of the
pending rows' index (the claim's own order), never the whole backlog.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Max, Min

from .. import clock
from ..conf import inbox_settings
from ..db import counting, statements
from ..wording import counted
from .models import OutboxMessage

Status = OutboxMessage.Status

#: Above this many rows (PostgreSQL's estimate), ``sent`` rows are estimated, not counted.
ESTIMATE_ABOVE = 100_000
#: Seconds a due row may wait for a claim before nobody is said to be claiming: relays poll
#: every fraction of a second, and a busy one claims its next batch as soon as one settles.
UNCLAIMED_AFTER = 60.0
#: Seconds since the last row was sent within which relays are said to be sending.
SENT_RECENTLY = 60.0
#: Rows of the earliest due time read for the latest failed attempt, at most.
SAMPLE = 100


@dataclass
class OutboxStats:
    """The outbox's state: what the relays have still to send, and what they gave up on."""

    pending: int = 0
    dead: int = 0
    sent: int = 0
    #: Seconds the oldest pending row has waited since it was written (the relay's lag).
    oldest_pending_age: float = 0.0
    #: Whether ``sent`` is PostgreSQL's estimate (a large table) rather than a count.
    sent_estimated: bool = False
    #: Whether ``pending`` and ``dead`` are estimates (more rows than
    #: :data:`~django_inbox.db.counting.EXACT_UP_TO`).
    pending_estimated: bool = False
    dead_estimated: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    #: Seconds since a row was last sent (``None``: no sent row is kept).
    last_sent_age: float | None = None
    #: Seconds the first due pending row has been due, unclaimed (negative: the first is due
    #: in the future; ``0`` with no due row).
    unclaimed_for: float = 0.0
    #: The latest failed attempt among the first due rows: its error, how long ago, which
    #: attempt of which message (``""``: none failed).
    last_failure: str = ""
    last_failure_age: float = 0.0
    last_failure_attempt: int = 0
    last_failure_message_id: str = ""


def collect(now: datetime | None = None) -> OutboxStats:
    """Pending rows and the oldest one's age, and dead rows, each counted over its partial
    index; ``sent`` rows counted, or on a large table estimated (no scan; PostgreSQL, MariaDB
    and MySQL). With pending rows, what the relays do about them (:func:`_relaying`)."""
    now = now or clock.now()
    using = inbox_settings.database
    rows = OutboxMessage.objects.using(using).order_by()
    # At most EXACT_UP_TO + 1 pending rows are read, in due order (a relay down for an hour
    # leaves a backlog that a count would read whole); beyond that the count is estimated and
    # the oldest is that of the rows due first (written first, unless retried or held: an
    # approximation, said in the docs).
    found = counting.sample(
        rows.filter(status=Status.PENDING),
        (),
        {"oldest": ("min", "created_at")},
        order_by=("next_attempt_at", "id"),
    )
    head: dict[str, Any] = found.groups[0] if found.groups else {"n": 0, "oldest": None}
    stats = OutboxStats(pending=int(head["n"]))
    if not found.complete:
        guess = counting.estimate(rows.filter(status=Status.PENDING))
        if guess is None:  # no planner estimate (SQLite): count
            stats.pending = rows.filter(status=Status.PENDING).count()
        else:
            stats.pending, stats.pending_estimated = max(guess, stats.pending), True
    stats.dead, stats.dead_estimated = counting.bounded_count(rows.filter(status=Status.DEAD))
    oldest: datetime | None = head["oldest"]
    if oldest is not None:
        stats.oldest_pending_age = max((now - oldest).total_seconds(), 0.0)
    # The planner's estimate, scaled to the table's size (reltuples stays at the last ANALYZE).
    estimate = statements.estimated_rows(using, OutboxMessage._meta.db_table)
    if estimate > ESTIMATE_ABOVE:
        stats.sent, stats.sent_estimated = max(estimate - stats.pending - stats.dead, 0), True
    else:
        stats.sent = rows.filter(status=Status.SENT).count()
    stats.counts = {Status.PENDING: stats.pending, Status.SENT: stats.sent, Status.DEAD: stats.dead}
    if stats.pending:
        _relaying(stats, using, now)
    return stats


def _relaying(stats: OutboxStats, using: str, now: datetime) -> None:
    """When a row was last sent, how long the first due row has waited for a claim, and the
    latest failed attempt among the rows due first (those of the earliest due time, up to
    :data:`SAMPLE`): the rows a claim takes next. A failed row goes back among them with its
    backoff, so while relays run and fail, they carry the latest failures. Each reads an end
    of an index (``MIN``/``MAX``, an equality on its first column), not the backlog (with
    statistics from before a backlog, ``MIN`` may read the pending rows, as the count does).
    """
    rows = OutboxMessage.objects.using(using).order_by()
    last_sent = rows.filter(status=Status.SENT).aggregate(at=Max("sent_at"))["at"]
    if last_sent is not None:
        stats.last_sent_age = max((now - last_sent).total_seconds(), 0.0)
    pending = rows.filter(status=Status.PENDING)
    first_due = pending.aggregate(at=Min("next_attempt_at"))["at"]
    if first_due is None:
        return
    stats.unclaimed_for = (now - first_due).total_seconds()  # negative: due in the future
    head = pending.filter(next_attempt_at=first_due).order_by("next_attempt_at", "pk")
    failed = [
        row
        for row in head.values_list("updated_at", "attempts", "last_error", "message_id")[:SAMPLE]
        if row[1] and row[2]
    ]
    if failed:
        at, attempt, error, message_id = max(failed, key=lambda row: row[0])
        stats.last_failure, stats.last_failure_attempt = error, attempt
        stats.last_failure_age = max((now - at).total_seconds(), 0.0)
        stats.last_failure_message_id = message_id


def problems(stats: OutboxStats, max_pending_age: float) -> list[tuple[str, float, str]]:
    """What ``inbox_stats`` and the health view report of the outbox: ``(kind, value,
    message)`` for dead rows (``outbox_dead``) and a pending row older than
    ``max_pending_age`` (``outbox_lag``), saying why it waits (:func:`lag_cause`)."""
    found: list[tuple[str, float, str]] = []
    if stats.dead:
        said = f"{counted(stats.dead, 'outbox message')} dead: not published after their attempts"
        found.append(("outbox_dead", stats.dead, said))
    lag = stats.oldest_pending_age
    if max_pending_age and lag > max_pending_age:
        said = (
            f"the oldest pending outbox message was written {lag:.0f}s ago (limit "
            f"{max_pending_age:g}s): {lag_cause(stats)}"
        )
        found.append(("outbox_lag", lag, said))
    return found


def lag_cause(stats: OutboxStats) -> str:
    """Why pending rows wait: relays send but are behind; nobody claims due rows; relays
    claim them and the attempts fail (with the latest reason); or, knowing none of these, the
    question to ask."""
    sending = stats.last_sent_age is not None and stats.last_sent_age <= SENT_RECENTLY
    failure = ""
    if stats.last_failure:
        failure = (
            f"the latest, attempt {stats.last_failure_attempt} of "
            f"{stats.last_failure_message_id} {stats.last_failure_age:.0f}s ago, failed: "
            f"{stats.last_failure[:300]}"
        )
    if sending:
        return f"relays are sending (the last {stats.last_sent_age:.0f}s ago) but are behind" + (
            f"; {failure}" if failure else ""
        )
    if stats.unclaimed_for > UNCLAIMED_AFTER:
        return (
            f"nothing was sent {_since(stats.last_sent_age)} and no relay has claimed a due "
            f"message for {stats.unclaimed_for:.0f}s: is a relay running, and can it reach its "
            "database and broker?"
        )
    if failure:
        after = (
            f" (the next attempt in {-stats.unclaimed_for:.0f}s)" if stats.unclaimed_for < 0 else ""
        )
        return (
            f"nothing was sent {_since(stats.last_sent_age)} and the attempts fail{after}: "
            f"{failure}"
        )
    return "is a relay running?"


def _since(age: float | None) -> str:
    return "(no sent message is kept)" if age is None else f"for {age:.0f}s"


def pending_count(using: str | None = None) -> int:
    """How many rows are ``pending`` (counted over their partial index)."""
    rows = OutboxMessage.objects.using(using or inbox_settings.database)
    return rows.filter(status=Status.PENDING).count()


def anything_pending(using: str | None = None) -> bool:
    """Whether any row is ``pending``, due or not: what a relay that cannot reach its broker
    asks before it calls itself idle."""
    rows = OutboxMessage.objects.using(using or inbox_settings.database)
    return rows.filter(status=Status.PENDING).exists()
