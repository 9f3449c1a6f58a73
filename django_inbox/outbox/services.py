"""Operations on outbox rows, for the admin, commands, Celery tasks and your own code: replay,
purge, counts, the relay (:func:`relay`, :func:`relay_for`), and what the inbox's stats,
problems, purge and tasks ask of the outbox (:class:`OutboxCompanion`, registered with
:mod:`django_inbox.companions` when the app is ready)."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, Unpack

from django.db import DatabaseError, transaction
from django.db.models import Count, QuerySet

from .. import clock
from ..conf import inbox_settings
from ..db.aside import with_status
from ..db.connection import table_exists
from ..services.actions import ActionOptions, ActionResult, options_of
from ..wording import counted
from .health import ESTIMATE_ABOVE as ESTIMATE_ABOVE
from .health import OutboxStats as OutboxStats
from .health import anything_pending as anything_pending
from .health import collect as collect
from .health import pending_count as pending_count
from .health import problems as problems
from .models import OutboxMessage
from .publisher import BrokerUnreachable as BrokerUnreachable
from .relay import Relay as Relay
from .relay import RelayStats as RelayStats
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
    from .held import sweep

    actor, reason, via, dry_run, keep = options_of("replay", options)
    batch_size = options.get("batch_size", 500)
    using = inbox_settings.database
    selected = rows.using(using).order_by()
    result = ActionResult("replay", dry_run=dry_run)
    others = selected.exclude(status__in=REPLAYABLE).values("status").annotate(n=Count("pk"))
    for other in others:
        result.refused[f"{other['status']} (not dead)"] += other["n"]
    now = clock.now()
    changes: dict[str, Any] = {
        "status": Status.PENDING,
        "attempts": 0,
        "locked_until": None,
        "lease_id": "",
        "updated_at": now,
    }
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
            "outbox: %s replayed by %s via %s%s",
            counted(result.total, "dead row"),
            actor,
            via,
            f" (reason: {reason})" if reason else "",
        )
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


def purge(*, older_than: float | None = None, batch_size: int = 1000) -> int:
    """Delete ``sent`` rows sent more than ``older_than`` seconds ago (default
    ``INBOX_OUTBOX_RETENTION``), ``batch_size`` per statement. Returns how many."""
    using = inbox_settings.database
    retention = outbox_settings.retention if older_than is None else older_than
    cutoff = clock.now() - timedelta(seconds=retention)
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


def relay(broker_url: str, **options: Any) -> Relay:
    """A relay publishing the outbox to ``broker_url`` (``INBOX_BROKER_TRANSPORT_OPTIONS``
    applied); ``options`` are :class:`~django_inbox.outbox.relay.Relay`'s. Call ``run()``."""
    options.setdefault("transport_options", inbox_settings.broker_transport_options)
    return Relay(broker_url, **options)


def relay_for(
    broker_url: str,
    *,
    max_messages: int | None = 10_000,
    max_seconds: float = 50.0,
    batch_size: int = 100,
) -> RelayStats:
    """Publish for at most ``max_seconds`` (or ``max_messages``, or until a second passes with
    nothing due), then return: what a periodic task runs."""
    import threading

    running = relay(broker_url, batch_size=batch_size, until_idle=1.0, max_messages=max_messages)
    timer = threading.Timer(max_seconds, running.shutdown.request)
    timer.daemon = True
    timer.start()
    try:
        return running.run()
    finally:
        timer.cancel()


class OutboxCompanion:
    """What the inbox asks of the outbox (:class:`django_inbox.companions.Companion`)."""

    def collect(self, now: Any) -> OutboxStats:
        return collect(now)

    def problems(self, stats: Any, max_pending_age: float) -> list[tuple[str, float, str]]:
        return problems(stats, max_pending_age)

    def purge(self, *, older_than: float | None, batch_size: int) -> int:
        return purge(older_than=older_than, batch_size=batch_size)

    def relay(
        self, broker_url: str, *, max_messages: int | None, max_seconds: float, batch_size: int
    ) -> dict[str, Any]:
        stats = relay_for(
            broker_url, max_messages=max_messages, max_seconds=max_seconds, batch_size=batch_size
        )
        return {
            "sent": stats.sent,
            "failed": dict(stats.failed),
            "reconnects": stats.reconnects,
            "reached": stats.reached,
        }
