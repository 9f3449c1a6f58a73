"""Claiming due rows: the step that counts an attempt before any handler runs.

A claim commits ``in_progress``, the counted attempt and a lease *before* the handler runs, so
a message that kills its worker still reaches ``dead`` after ``max_attempts``. Rows locked by
another claimer are skipped, never waited for.
"""

from __future__ import annotations

import time
from datetime import timedelta

from django.db import connections, transaction
from django.db.models import F, QuerySet, Value
from django.db.models.functions import Least

from .. import clock
from ..conf import inbox_settings
from ..db.aside import with_status
from ..db.connection import connection_lost
from ..families import family
from ..models import ATTEMPTS_MAX, POLLED_STATUSES, InboxMessage
from . import interruptions, leases
from .takeover import take_over

Status = InboxMessage.Status

#: Seconds a worker may go on claiming with :func:`~django_inbox.db.statements.claim_fresh`
#: before it looks for rows of dead workers again.
TAKEOVER_CHECK_INTERVAL = 1.0
_takeover_checked: dict[tuple[str, str], float] = {}

#: What the general claim reads of a candidate row.
_CANDIDATE_FIELDS = (
    "id",
    "consumer",
    "status",
    "attempts",
    "event_type",
    "history",
    "message_id",
    "lease_id",
)


def claim_batch(
    consumer: str,
    limit: int,
    *,
    using: str | None = None,
    message_id: str | None = None,
    shared_transaction: bool = False,
) -> list[InboxMessage]:
    """Claim up to ``limit`` due rows of ``consumer`` and return them, attempt counted.

    Due rows are ``received`` ones, ``failed`` ones whose ``next_attempt_at`` has come and
    ``in_progress`` ones whose lease expired (see
    :func:`~django_inbox.processing.takeover.take_over`).
    The returned rows must be processed in the order given (by primary key): the take-over
    relies on it to tell which row of a dead worker's batch was running. ``message_id``
    restricts the claim to that one message. ``shared_transaction`` marks the batch for
    :func:`~django_inbox.processing.attempts.process_batch`, unless it takes over rows of a
    dead worker: those are always run one transaction each.
    """
    using = using or inbox_settings.database
    lease_id = leases.new_lease_id(shared=shared_transaction)
    if not connections[using].in_atomic_block:
        # Every claimant computes leases on the database's clock, also a web process's
        # deliver() of a stored row and a Celery task (every few seconds: one query).
        clock.refresh(using)
    try:
        return _claim(consumer, limit, using, message_id, lease_id)
    except Exception as exc:
        # The claim may have committed with its reply lost: its rows hold a lease nobody
        # knows. Give them back, uncounted, once the database is reachable again.
        if connection_lost(exc, using):
            for lease in {lease_id, leases.solo(lease_id)}:
                interruptions.note([], using=using, lease_id=lease, error=exc)
        raise


def _claim(
    consumer: str, limit: int, using: str, message_id: str | None, lease_id: str
) -> list[InboxMessage]:
    now = clock.now()
    until = now + timedelta(seconds=inbox_settings.policy(consumer).lease)
    rows_of = family(using)
    if message_id is None:
        # Usually nothing was abandoned: claim new and due rows in one statement (where the
        # database has one), and look for dead workers' rows (the general path below) at
        # least every second.
        checked = time.monotonic() - _takeover_checked.get((using, consumer), 0.0)
        if checked < TAKEOVER_CHECK_INTERVAL:
            claimed = rows_of.claim_fresh(consumer, limit, lease_id, until, now, using)
            if claimed:
                return claimed
        _takeover_checked[(using, consumer)] = time.monotonic()
    else:
        # One message by its id (deliver() of a stored one, an ordered consumer's released
        # version): one statement. Only a take-over of its abandoned lease takes the general
        # path below.
        claimed = rows_of.claim_message(consumer, message_id, lease_id, until, now, using)
        if claimed:
            return claimed
    rows = InboxMessage.objects.using(using)
    due: QuerySet[InboxMessage]
    if message_id is None:
        due = rows.due(now).filter(consumer=consumer)
    else:  # found by its id, whatever the statistics say (db/aside.py)
        one = rows.identified((consumer, message_id)).filter(next_attempt_at__lte=now)
        due = with_status(one, *POLLED_STATUSES)
    with transaction.atomic(using=using):
        candidates = list(
            due.order_by("next_attempt_at", "pk")
            .select_for_update(skip_locked=True)
            .only(*_CANDIDATE_FIELDS)[:limit]
        )
        abandoned = [row for row in candidates if row.status == Status.IN_PROGRESS]
        dropped = take_over(abandoned, now, using) if abandoned else set()
        ids = [row.pk for row in candidates if row.pk not in dropped]
        if not ids:
            return []
        if abandoned:
            lease_id = leases.solo(lease_id)  # a dead worker's rows run one transaction each
        chosen = with_status(rows.filter(pk__in=ids, next_attempt_at__lte=now), *POLLED_STATUSES)
        chosen.update(
            status=Status.IN_PROGRESS,
            attempts=Least(F("attempts"), Value(ATTEMPTS_MAX - 1)) + 1,
            lease_id=lease_id,
            locked_until=until,
            next_attempt_at=until,
            updated_at=now,
        )
        return list(rows.filter(pk__in=ids, lease_id=lease_id).order_by("pk"))
