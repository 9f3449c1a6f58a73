"""Holding a key's later outbox rows behind its oldest pending one: ``publish()`` writes them
without a due time, the relay that settles the row ahead releases the next (:func:`release`),
a sweep releases what nothing released (:func:`sweep`), and a claim never takes a row a
pending row of its key is ahead of (:func:`first_of_key`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from django.db import connections
from django.db.models import BooleanField, Min, Q, Subquery
from django.db.models.expressions import RawSQL

from .. import clock
from ..db import preparing
from .models import OutboxMessage

Status = OutboxMessage.Status

#: Keys per statement of a sweep (a parameter per key: PostgreSQL takes at most 65,535).
SWEEP_CHUNK = 1000


def holds_rows(using: str) -> bool:
    """Whether ``publish()`` holds a key's later rows on ``using``'s database. MySQL and
    MariaDB refuse the subquery on the table an ``INSERT`` writes that decides it: there every
    row is written due, and a claim takes only the first pending row of each key
    (:func:`first_of_key`), which keeps a key's order."""
    return connections[using].vendor in ("postgresql", "sqlite")


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
    now = now or clock.now()
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
    now = now or clock.now()
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
