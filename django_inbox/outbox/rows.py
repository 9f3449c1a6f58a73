"""The relay's changes to outbox rows: claim, mark sent, record a failure, give back.

Every change after the claim is fenced on the claim's lease id, so a relay whose lease ran
out (it hung, another relay took the rows over) cannot overwrite what the other one did.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Greatest, Least

from .. import clock
from ..db.statements.common import fence
from ..intake.validation import ATTEMPTS_MAX
from ..processing import retry
from ..text import storable
from .held import first_of_key, release
from .held import sweep as sweep
from .models import OutboxMessage
from .settings import outbox_settings

Status = OutboxMessage.Status
MAX_ERROR = 2000


@dataclass
class Claimed:
    """A claimed row, as the relay publishes it."""

    pk: int
    message_id: str
    event_type: str
    payload: Any
    headers: dict[str, Any]
    exchange: str
    routing_key: str
    key: str
    attempts: int


def claim(limit: int, using: str, *, now: datetime | None = None) -> tuple[str, list[Claimed]]:
    """Claim up to ``limit`` pending rows that are due, under a new lease; count the attempt.

    Of a key's pending rows only the oldest can be claimed: the next one waits until it is
    sent (or dead), so a key's messages are published one at a time, in the order written,
    whatever the number of relays. The rows behind it are held (``next_attempt_at`` is
    ``NULL``, see :func:`release`), so a long backlog on one key costs a claim nothing; the
    ``NOT EXISTS`` below settles the few rows two transactions wrote at once. Rows another
    relay holds are skipped (``SKIP LOCKED``). Returns the lease id and the rows in the order
    written (by primary key).
    """
    now = now or clock.now()
    lease_id = str(uuid.uuid4())
    until = now + timedelta(seconds=outbox_settings.lease)
    rows = (
        OutboxMessage.objects.using(using)
        .filter(status=Status.PENDING, next_attempt_at__lte=now)
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        .filter(Q(key="") | first_of_key(using))
        .order_by("next_attempt_at", "pk")  # the pending index's order: LIMIT stops early
    )
    features = connections[using].features
    with transaction.atomic(using=using):
        if features.has_select_for_update_skip_locked:
            # OF: lock the claimed rows only, not those the key test reads (MySQL and MariaDB
            # have no OF, and lock what the statement reads).
            of = ("self",) if features.has_select_for_update_of else ()
            rows = rows.select_for_update(skip_locked=True, of=of)
        elif features.has_select_for_update:
            rows = rows.select_for_update()
        found = list(
            rows.values_list(
                "pk",
                "message_id",
                "event_type",
                "payload",
                "headers",
                "exchange",
                "routing_key",
                "key",
                "attempts",
            )[:limit]
        )
        if not found:
            return lease_id, []
        OutboxMessage.objects.using(using).filter(pk__in=[row[0] for row in found]).update(
            lease_id=lease_id,
            locked_until=until,
            attempts=Least(F("attempts"), Value(ATTEMPTS_MAX - 1)) + 1,
            updated_at=now,
        )
    return lease_id, [
        Claimed(*row[:4], row[4] or {}, *row[5:8], min(row[8] + 1, ATTEMPTS_MAX))
        for row in sorted(found)
    ]


def mark_sent(pks: list[int], lease_id: str, using: str, keys: Iterable[str] = ()) -> int:
    """The broker confirmed these rows: ``sent``, in one statement, then the next row of each
    of their ``keys`` is released. Returns how many rows this relay still held (a row whose
    lease ran out and was taken over is left to the other).

    Only the claim gives a row a lease id, and settling a row clears it, so the lease alone
    says the row is still pending and ours. Its status is not in the ``WHERE``: with
    statistics from before a backlog, PostgreSQL would read the pending rows' partial index
    for it (measured: 199,900 rows read for a batch of 100) instead of the batch's primary
    keys."""
    if not pks:
        return 0
    now = clock.now()
    sent = (
        OutboxMessage.objects.using(using)
        .filter(pk__in=pks, lease_id=fence(lease_id))
        .update(
            status=Status.SENT,
            sent_at=now,
            updated_at=now,
            next_attempt_at=None,
            locked_until=None,
            lease_id="",
            last_error="",
        )
    )
    release(keys, using, now=now)
    return sent


def backoff(attempts: int) -> float:
    """Seconds before the next attempt: the inbox's backoff (exponential with full jitter,
    capped for any number of attempts) with the outbox's base and cap."""
    return retry.full_jitter(
        retry.ceiling(attempts, outbox_settings.backoff_base, outbox_settings.backoff_max)
    )


def fail(row: Claimed, lease_id: str, error: str, using: str, *, dead: bool = False) -> str:
    """A publication of ``row`` failed: ``pending`` again after a backoff, or ``dead`` once its
    attempts are used up (or at once with ``dead``). Returns the new status."""
    now = clock.now()
    used_up = retry.used_up(row.attempts, outbox_settings.max_attempts)
    dead = dead or used_up
    reason = storable(error)[:MAX_ERROR]
    if used_up:
        reason = f"{reason} (giving up after {row.attempts} attempts)"[:MAX_ERROR]
    changed = (
        OutboxMessage.objects.using(using)
        .filter(pk=row.pk, lease_id=fence(lease_id))
        .update(
            status=Status.DEAD if dead else Status.PENDING,
            next_attempt_at=None if dead else now + timedelta(seconds=backoff(row.attempts)),
            locked_until=None,
            lease_id="",
            last_error=reason,
            updated_at=now,
        )
    )
    if dead and changed:
        release([row.key], using, now=now)  # a dead row holds back its key no longer
    return Status.DEAD if dead else Status.PENDING


def give_back(pks: list[int], lease_id: str, using: str) -> int:
    """Rows claimed but not published (the broker went away first): due now, the claim's
    attempt not counted. Fenced on the lease alone, as :func:`mark_sent` is."""
    if not pks:
        return 0
    now = clock.now()
    return (
        OutboxMessage.objects.using(using)
        .filter(pk__in=pks, lease_id=fence(lease_id))
        .update(
            attempts=Greatest(F("attempts"), Value(1)) - 1,  # unsigned on MySQL: never 0 - 1
            next_attempt_at=now,
            locked_until=None,
            lease_id="",
            updated_at=now,
        )
    )
