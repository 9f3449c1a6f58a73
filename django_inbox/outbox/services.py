"""Operations on outbox rows, for the admin, commands and your own code."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Unpack

from django.db import DatabaseError, transaction
from django.db.models import Count, Min, QuerySet
from django.utils import timezone

from ..conf import inbox_settings
from ..db import statements
from ..db.aside import with_status
from ..db.connection import table_exists
from ..services.actions import ActionOptions, ActionResult, options_of
from .models import OutboxMessage
from .settings import outbox_settings

Status = OutboxMessage.Status
logger = logging.getLogger("django_inbox.outbox")


#: The statuses a replay changes rows from.
REPLAYABLE = (Status.DEAD,)


def replay(rows: QuerySet[OutboxMessage]) -> int:
    """Send the ``dead`` rows among ``rows`` back to ``pending`` (see :func:`replay_dead`);
    returns how many changed."""
    return replay_dead(rows, actor="python", keep=0).total


def replay_dead(rows: QuerySet[OutboxMessage], **options: Unpack[ActionOptions]) -> ActionResult:
    """Send the ``dead`` rows among ``rows`` back to ``pending``, with a fresh set of attempts
    and the same message id (the receiver deduplicates a copy it already has). Rows without a
    key are due now; a key's rows are held, as ``publish()`` writes a row behind another of
    its key, and then each key's oldest pending row is made due: replayed rows of one key go
    out one at a time, and claims don't read past them.

    Takes the options of the inbox's actions (``actor`` required; ``reason``, ``via``,
    ``dry_run``, ``batch_size``, ``keep``) and logs who replayed how many rows and why (an
    outbox row keeps no history: the admin adds a ``LogEntry`` per row). Returns an
    :class:`~django_inbox.services.ActionResult`: rows changed by the status they had, the
    selected rows left alone by status, and ``(pk, event_type, message_id, "dead")`` of the
    first ``keep`` rows changed."""
    from .rows import sweep

    actor, reason, via, dry_run, keep = options_of("replay", options)
    batch_size = options.get("batch_size", 500)
    using = inbox_settings.database
    selected = rows.using(using).order_by()
    result = ActionResult("replay", dry_run=dry_run)
    others = selected.exclude(status__in=REPLAYABLE).values("status").annotate(n=Count("pk"))
    for other in others:
        result.refused[f"{other['status']} (not dead)"] += other["n"]
    now = timezone.now()
    changes: dict[str, Any] = {
        "status": Status.PENDING, "attempts": 0, "locked_until": None, "lease_id": "",
        "updated_at": now,
    }  # fmt: skip
    messages = OutboxMessage.objects.using(using)
    pks = list(selected.filter(status__in=REPLAYABLE).values_list("pk", flat=True))
    held = 0
    for first in range(0, len(pks), batch_size):
        with transaction.atomic(using=using):
            chunk = messages.filter(pk__in=pks[first : first + batch_size], status=Status.DEAD)
            found = list(
                (chunk if dry_run else chunk.select_for_update())
                .order_by("pk")
                .values_list("pk", "event_type", "message_id", "key")
            )
            if not dry_run:
                plain = [pk for pk, _, _, key in found if not key]
                keyed = [pk for pk, _, _, key in found if key]
                messages.filter(pk__in=plain).update(next_attempt_at=now, **changes)
                held += messages.filter(pk__in=keyed).update(next_attempt_at=None, **changes)
        result.changed[Status.DEAD] += len(found)
        room = len(found) if keep is None else max(keep - len(result.rows), 0)
        result.rows += [(pk, event, message_id, Status.DEAD) for pk, event, message_id, _ in found][
            :room
        ]
    if held:
        sweep(using, now=now)
    if result.total and not dry_run:
        logger.info(
            "outbox: %d dead row(s) replayed by %s via %s%s",
            result.total, actor, via, f" (reason: {reason})" if reason else "",
        )  # fmt: skip
    return result


#: The outbox's table.
TABLE = OutboxMessage._meta.db_table


def migrated(using: str | None = None) -> bool | None:
    """Whether the outbox's table exists (``migrate`` was run); ``None`` when the database
    cannot be asked (a relay waits for it)."""
    try:
        return table_exists(using or inbox_settings.database, TABLE)
    except DatabaseError:
        return None


def pending_count(using: str | None = None) -> int:
    """How many rows are ``pending`` (counted over their partial index)."""
    rows = OutboxMessage.objects.using(using or inbox_settings.database)
    return rows.filter(status=Status.PENDING).count()


def anything_pending(using: str | None = None) -> bool:
    """Whether any row is ``pending``, due or not: what a relay that cannot reach its broker
    asks before it calls itself idle."""
    rows = OutboxMessage.objects.using(using or inbox_settings.database)
    return rows.filter(status=Status.PENDING).exists()


#: Above this many rows (PostgreSQL's estimate), ``sent`` rows are estimated, not counted.
ESTIMATE_ABOVE = 1_000_000


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
    counts: dict[str, int] = field(default_factory=dict)


def collect(now: datetime | None = None) -> OutboxStats:
    """Pending rows and the oldest one's age, and dead rows, each counted over its partial
    index; ``sent`` rows counted, or on a large PostgreSQL table estimated (no scan)."""
    now = now or timezone.now()
    using = inbox_settings.database
    rows = OutboxMessage.objects.using(using).order_by()
    pending = rows.filter(status=Status.PENDING).aggregate(n=Count("pk"), oldest=Min("created_at"))
    stats = OutboxStats(pending=pending["n"], dead=rows.filter(status=Status.DEAD).count())
    if pending["oldest"] is not None:
        stats.oldest_pending_age = max((now - pending["oldest"]).total_seconds(), 0.0)
    # The planner's estimate, scaled to the table's size (reltuples stays at the last ANALYZE).
    estimate = statements.estimated_rows(using, OutboxMessage._meta.db_table)
    if estimate > ESTIMATE_ABOVE:
        stats.sent, stats.sent_estimated = max(estimate - stats.pending - stats.dead, 0), True
    else:
        stats.sent = rows.filter(status=Status.SENT).count()
    stats.counts = {Status.PENDING: stats.pending, Status.SENT: stats.sent, Status.DEAD: stats.dead}
    return stats


def problems(stats: OutboxStats, max_pending_age: float) -> list[tuple[str, float, str]]:
    """What ``inbox_stats`` and the health view report of the outbox: ``(kind, value,
    message)`` for dead rows (``outbox_dead``) and a pending row older than
    ``max_pending_age`` (``outbox_lag``)."""
    found: list[tuple[str, float, str]] = []
    if stats.dead:
        said = f"{stats.dead} outbox message(s) dead: not published after their attempts"
        found.append(("outbox_dead", stats.dead, said))
    lag = stats.oldest_pending_age
    if max_pending_age and lag > max_pending_age:
        said = (
            f"the oldest pending outbox message was written {lag:.0f}s ago (limit "
            f"{max_pending_age:g}s): is a relay running?"
        )
        found.append(("outbox_lag", lag, said))
    return found


def purge(*, older_than: float | None = None, batch_size: int = 1000) -> int:
    """Delete ``sent`` rows sent more than ``older_than`` seconds ago (default
    ``INBOX_OUTBOX_RETENTION``), ``batch_size`` per statement. Returns how many."""
    using = inbox_settings.database
    retention = outbox_settings.retention if older_than is None else older_than
    cutoff = timezone.now() - timedelta(seconds=retention)
    deleted = 0
    while True:
        batch = list(
            OutboxMessage.objects.using(using)
            .filter(status=Status.SENT, sent_at__lt=cutoff)
            .order_by("sent_at")
            .values_list("pk", flat=True)[:batch_size]
        )
        if not batch:
            return deleted
        chosen = OutboxMessage.objects.using(using).filter(pk__in=batch)
        count, _ = with_status(chosen, Status.SENT).delete()
        deleted += count
