"""The relay's changes to outbox rows: claim, mark sent, record a failure, give back.

Every change after the claim is fenced on the claim's lease id, so a relay whose lease ran
out (it hung, another relay took the rows over) cannot overwrite what the other one did.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import BooleanField, F, Min, Q, Subquery, Value
from django.db.models.expressions import RawSQL
from django.db.models.functions import Greatest, Least
from django.utils import timezone

from ..db import preparing
from ..db.statements.common import fence
from ..intake.validation import ATTEMPTS_MAX
from ..processing import retry
from ..text import storable
from .models import OutboxMessage
from .settings import outbox_settings

Status = OutboxMessage.Status
MAX_ERROR = 2000
#: Keys ``sweep()`` looks at per statement.
SWEEP_CHUNK = 1000


def _table(using: str) -> tuple[str, Callable[[str], str]]:
    quote = connections[using].ops.quote_name
    return quote(OutboxMessage._meta.db_table), quote


def first_of_key(using: str) -> RawSQL:
    """True for a row no earlier pending row of its key holds back.

    Written as "the previous entry of the key index", ``ORDER BY key DESC, id DESC LIMIT 1``
    from ``(key, id)``: only that index gives the order, so the database reads one entry
    whatever its statistics say. (A plain ``NOT EXISTS (... id < outer.id)`` lets PostgreSQL
    pick a scan of the primary key or of the table when one key fills it: a claim then read
    every row of the hot key's backlog.)
    """
    table, quote = _table(using)
    key, pk, status = quote("key"), quote("id"), quote("status")
    if connections[using].vendor == "mysql":
        # MySQL and MariaDB refuse an outer column inside a derived table: the plain form,
        # which their (key, id) index answers with one probe.
        return RawSQL(
            f"NOT EXISTS (SELECT 1 FROM {table} e WHERE e.{status} = 'pending' "
            f"AND e.{key} = {table}.{key} AND e.{pk} < {table}.{pk})",
            (),
            output_field=BooleanField(),
        )
    return RawSQL(
        f"NOT EXISTS (SELECT 1 FROM (SELECT e.{key} FROM {table} e "
        f"WHERE e.{status} = 'pending' AND e.{key} <> '' "
        f"AND (e.{key}, e.{pk}) < ({table}.{key}, {table}.{pk}) "
        f"ORDER BY e.{key} DESC, e.{pk} DESC LIMIT 1) previous "
        f"WHERE previous.{key} = {table}.{key})",
        (),
        output_field=BooleanField(),
    )


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
    now = now or timezone.now()
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
    now = timezone.now()
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


def release(keys: Iterable[str], using: str, *, now: datetime | None = None) -> int:
    """Make due the oldest pending row of each key if it is held.

    ``publish()`` holds a row (writes it without a due time) when its key already has a
    pending row; the relay that settles that row calls this. A key's oldest pending row is the
    first entry of the key index from the key on (``ORDER BY key, id LIMIT 1``, as in
    :func:`first_of_key`): one entry read, however long the key's backlog. Making a key's
    oldest pending row due is always right, whoever calls this and however often. Returns how
    many rows were released.
    """
    keys = sorted({key for key in keys if key})
    if not keys:
        return 0
    now = now or timezone.now()
    if connections[using].vendor == "postgresql":
        return _release_postgresql(keys, using, now)
    messages = OutboxMessage.objects.using(using)
    pending = messages.filter(status=Status.PENDING).exclude(key="")
    heads = Q()
    for key in keys:
        # The first entry of the key index from ``key`` on (see ``first_of_key``), if it is
        # this key's.
        head = pending.filter(key__gte=key).order_by("key", "pk").values("pk")[:1]
        heads |= Q(pk=Subquery(head), key=key)
    held = list(
        messages.filter(heads, status=Status.PENDING, next_attempt_at__isnull=True).values_list(
            "pk", flat=True
        )
    )
    if not held:
        return 0
    return messages.filter(pk__in=held, status=Status.PENDING, next_attempt_at__isnull=True).update(
        next_attempt_at=now
    )


def _release_postgresql(keys: list[str], using: str, now: datetime) -> int:
    """``release()`` in one prepared statement: each key's head through a lateral lookup of
    the key index (a statement of one subquery per key took longer to plan than to run),
    gathered first into an array (``= ANY(ARRAY(...))``, computed once: as ``IN (...)`` the
    planner may run the lookups once per held row)."""
    table, quote = _table(using)
    key, pk, status, due = quote("key"), quote("id"), quote("status"), quote("next_attempt_at")
    # Only the primary key in the WHERE (the status is checked in the SET): given "status =
    # 'pending'" there, a planner with stale statistics scanned the whole pending index.
    sql = (
        f"UPDATE {table} SET {due} = CASE WHEN {status} = 'pending' AND {due} IS NULL "
        f"THEN %s ELSE {due} END WHERE {pk} = ANY(ARRAY(SELECT head.{pk} "
        f"FROM unnest(%s::text[]) AS k(name) CROSS JOIN LATERAL (SELECT e.{pk}, e.{key}, e.{due} "
        f"FROM {table} e WHERE e.{status} = 'pending' AND e.{key} <> '' AND e.{key} >= k.name "
        f"ORDER BY e.{key}, e.{pk} LIMIT 1) head "
        f"WHERE head.{key} = k.name AND head.{due} IS NULL))"
    )
    with preparing.cursor(using) as cursor:
        cursor.execute(sql, [now, keys])
        return int(cursor.rowcount)


def sweep(using: str, *, now: datetime | None = None) -> int:
    """Release the held rows no earlier pending row holds back.

    A row is held when ``publish()`` sees an earlier pending row of its key. The relay that
    settles that row releases the next one, and so does the publisher once it commits (the
    relay may have looked while its transaction was open); if the publisher's process died
    in between, the row is held with nothing ahead of it. Relays sweep every few seconds (and
    when they start). Reads every held row, to group them by key.
    """
    messages = OutboxMessage.objects.using(using)
    firsts = list(
        messages.filter(status=Status.PENDING, next_attempt_at__isnull=True)
        .exclude(key="")
        .order_by()
        .values("key")
        .annotate(first=Min("pk"))
        .values_list("first", flat=True)
    )
    now = now or timezone.now()
    released = 0
    # By chunks: a parameter per key could pass the 65,535 that PostgreSQL takes (under
    # server-side binding) once that many keys have held rows, as after a broker outage.
    for start in range(0, len(firsts), SWEEP_CHUNK):
        heads = list(
            messages.filter(
                pk__in=firsts[start : start + SWEEP_CHUNK],
                status=Status.PENDING,
                next_attempt_at__isnull=True,
            )
            .filter(first_of_key(using))
            .values_list("pk", flat=True)
        )
        if heads:
            released += messages.filter(
                pk__in=heads, status=Status.PENDING, next_attempt_at__isnull=True
            ).update(next_attempt_at=now)
    return released


def backoff(attempts: int) -> float:
    """Seconds before the next attempt: the inbox's backoff (exponential with full jitter,
    capped for any number of attempts) with the outbox's base and cap."""
    return retry.full_jitter(
        retry.ceiling(attempts, outbox_settings.backoff_base, outbox_settings.backoff_max)
    )


def fail(row: Claimed, lease_id: str, error: str, using: str, *, dead: bool = False) -> str:
    """A publication of ``row`` failed: ``pending`` again after a backoff, or ``dead`` once its
    attempts are used up (or at once with ``dead``). Returns the new status."""
    now = timezone.now()
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
    now = timezone.now()
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
