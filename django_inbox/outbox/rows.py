"""The relay's changes to outbox rows: claim, mark sent, record a failure, give back.

Every change after the claim is fenced on the claim's lease id, so a relay whose lease ran
out (it hung, another relay took the rows over) cannot overwrite what the other one did.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from ..text import storable
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
    whatever the number of relays. Rows another relay holds are skipped (``SKIP LOCKED``).
    Returns the lease id and the rows in the order written (by primary key).
    """
    now = now or timezone.now()
    lease_id = str(uuid.uuid4())
    until = now + timedelta(seconds=outbox_settings.lease)
    # ``key != ''`` lets PostgreSQL use the partial index on a key's pending rows.
    earlier = (
        OutboxMessage.objects.using(using)
        .filter(key=OuterRef("key"), status=Status.PENDING, pk__lt=OuterRef("pk"))
        .exclude(key="")
    )
    rows = (
        OutboxMessage.objects.using(using)
        .filter(status=Status.PENDING, next_attempt_at__lte=now)
        .filter(Q(locked_until__isnull=True) | Q(locked_until__lt=now))
        .filter(Q(key="") | ~Exists(earlier))
        .order_by("next_attempt_at", "pk")  # the pending index's order: LIMIT stops early
    )
    features = connections[using].features
    with transaction.atomic(using=using):
        if features.has_select_for_update_skip_locked:
            rows = rows.select_for_update(skip_locked=True, of=("self",))
        elif features.has_select_for_update:
            rows = rows.select_for_update()
        found = list(
            rows.values_list(
                "pk", "message_id", "event_type", "payload", "headers", "exchange",
                "routing_key", "key", "attempts",
            )[:limit]
        )  # fmt: skip
        if not found:
            return lease_id, []
        OutboxMessage.objects.using(using).filter(pk__in=[row[0] for row in found]).update(
            lease_id=lease_id,
            locked_until=until,
            attempts=F("attempts") + 1,
            updated_at=now,
        )
    return lease_id, [
        Claimed(pk, message_id, event_type, payload, headers or {}, exchange, routing, key, n + 1)
        for pk, message_id, event_type, payload, headers, exchange, routing, key, n in sorted(found)
    ]


def mark_sent(pks: list[int], lease_id: str, using: str) -> int:
    """The broker confirmed these rows: ``sent``, in one statement. Returns how many this
    relay still held (a row whose lease ran out and was taken over is left to the other)."""
    if not pks:
        return 0
    now = timezone.now()
    return (
        OutboxMessage.objects.using(using)
        .filter(pk__in=pks, lease_id=lease_id, status=Status.PENDING)
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


def backoff(attempts: int) -> float:
    """Seconds before the next attempt: exponential with full jitter, capped."""
    ceiling = min(outbox_settings.backoff_max, outbox_settings.backoff_base * 2 ** (attempts - 1))
    return random.uniform(0, ceiling)


def fail(row: Claimed, lease_id: str, error: str, using: str, *, dead: bool = False) -> str:
    """A publication of ``row`` failed: ``pending`` again after a backoff, or ``dead`` once its
    attempts are used up (or at once with ``dead``). Returns the new status."""
    now = timezone.now()
    dead = dead or row.attempts >= outbox_settings.max_attempts
    reason = storable(error)[:MAX_ERROR]
    if dead and row.attempts >= outbox_settings.max_attempts:
        reason = f"{reason} (giving up after {row.attempts} attempts)"[:MAX_ERROR]
    OutboxMessage.objects.using(using).filter(pk=row.pk, lease_id=lease_id).update(
        status=Status.DEAD if dead else Status.PENDING,
        next_attempt_at=None if dead else now + timedelta(seconds=backoff(row.attempts)),
        locked_until=None,
        lease_id="",
        last_error=reason,
        updated_at=now,
    )
    return Status.DEAD if dead else Status.PENDING


def give_back(pks: list[int], lease_id: str, using: str) -> int:
    """Rows claimed but not published (the broker went away first): due now, the claim's
    attempt not counted."""
    if not pks:
        return 0
    now = timezone.now()
    return (
        OutboxMessage.objects.using(using)
        .filter(pk__in=pks, lease_id=lease_id, status=Status.PENDING)
        .update(
            attempts=F("attempts") - 1,
            next_attempt_at=now,
            locked_until=None,
            lease_id="",
            updated_at=now,
        )
    )
