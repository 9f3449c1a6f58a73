"""Tombstones: what ``inbox_purge`` keeps of a completed message, so that a late copy is
parked instead of running again.

Purging a ``completed`` row writes, in the same transaction, an
:class:`~django_inbox.models.InboxTombstone`: a 16-byte digest of ``(consumer, message_id)``
(:func:`digest`, the value of PostgreSQL's identity index, :mod:`django_inbox.db.identity`),
when the message completed, when it was purged, and when the tombstone expires (the consumer's
``tombstone_retention`` after the purge; ``None`` writes none). ``inbox_purge`` deletes expired
tombstones too.

An insert of a row that would run (``received``, ``in_progress``, ``completed``, ``failed``,
``waiting``) whose
pair has a tombstone goes in ``parked`` instead, and the inbox writes the reason
(:mod:`django_inbox.intake.late`):

- on PostgreSQL a ``BEFORE INSERT`` trigger (migration ``0015``) does it inside the insert, so
  a new message costs no statement more. Where a row of the same pair is there (a duplicate),
  the trigger takes the advisory lock :data:`PURGE_LOCK` shared: a purge of completed rows,
  which holds it exclusively until it commits, is waited for, and the trigger's next look at
  the tombstones (a new snapshot, as every statement of a PL/pgSQL function in ``READ
  COMMITTED``) sees the tombstone it committed. A purge that starts later waits for the
  duplicate's transaction, so the insert meets the row and is a duplicate.
- elsewhere the inbox reads the tombstone after the insert, in the same transaction (one of
  its own when the caller has none, so that no worker sees the row before it is parked:
  :func:`is_late`): an insert that waited for a purge deleting the pair's row sees the
  tombstone that purge committed (``READ COMMITTED``; a locking read at ``REPEATABLE READ``).
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from ..conf import inbox_settings
from ..models import InboxMessage, InboxTombstone

Status = InboxMessage.Status

#: The statuses of rows that run (or have run): only their inserts look for a tombstone.
#: ``parked``, ``dead`` and ``skipped`` rows never run by themselves.
RUNNING_STATUSES = (
    Status.RECEIVED,
    Status.IN_PROGRESS,
    Status.COMPLETED,
    Status.FAILED,
    Status.WAITING,
)

#: PostgreSQL's trigger and its function (migration 0015).
TRIGGER = "django_inbox_late_copy"
#: The advisory lock (PostgreSQL) a purge of completed rows holds exclusively until it commits,
#: and the trigger takes shared for a duplicate: the bytes of "dj_inbox" (migration 0015).
PURGE_LOCK = 7235700657752272760
#: PostgreSQL's function of a pair's digest (migration 0015): :func:`digest` in SQL.
DIGEST_FUNCTION = "django_inbox_tombstone_digest"


@dataclass(frozen=True)
class Tombstone:
    """A purged message's dates."""

    completed_at: datetime | None
    purged_at: datetime

    def reason(self) -> str:
        completed = _day_and_time(self.completed_at) if self.completed_at else "an unknown date"
        return (
            f"a copy of a message that completed on {completed} and was purged on "
            f"{_day_and_time(self.purged_at)}: parked, not run again (its tombstone is kept for "
            "INBOX_TOMBSTONE_RETENTION); replay it to run it once more"
        )


def _day_and_time(moment: datetime) -> str:
    return moment.isoformat(sep=" ", timespec="seconds")


def digest(consumer: str, message_id: str) -> uuid.UUID:
    """The first 16 bytes of SHA-256 of ``len(consumer):consumer`` + ``message_id`` (UTF-8),
    as :func:`django_inbox.db.identity.digest_sql` takes them on PostgreSQL, with the version
    and variant bits of a UUID of version 4 set (122 bits of the hash are kept): MariaDB's
    ``uuid`` column refuses some values without them, and some of version 8. PostgreSQL's
    trigger computes the same value with the function ``django_inbox_tombstone_digest``
    (migration 0015)."""
    text = f"{len(consumer)}:{consumer}{message_id}".encode("utf-8", "surrogatepass")
    raw = bytearray(hashlib.sha256(text).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return uuid.UUID(bytes=bytes(raw))


def retention(consumer: str) -> float | None:
    """Seconds ``consumer``'s tombstones are kept after the purge; ``None``: none is kept."""
    return inbox_settings.policy(consumer).tombstone_retention


def find(consumer: str, message_id: str, using: str) -> Tombstone | None:
    """The tombstone of ``(consumer, message_id)``, if one is kept. A locking read in a
    transaction on MySQL and MariaDB, which then sees a tombstone committed after a
    ``REPEATABLE READ`` snapshot."""
    rows = InboxTombstone.objects.using(using).filter(digest=digest(consumer, message_id))
    connection = connections[using]
    if connection.vendor == "mysql" and connection.in_atomic_block:
        rows = rows.select_for_update()  # outside a transaction each read is fresh anyway
    found = rows.values_list("completed_at", "purged_at").first()
    return None if found is None else Tombstone(*found)


def is_late(row: Any, using: str) -> bool:
    """Off PostgreSQL, after ``row`` went in: whether it is a late copy (a row that would run
    whose pair has a tombstone). The caller parks it in the insert's transaction
    (:func:`django_inbox.intake.late.record`)."""
    if row.status not in RUNNING_STATUSES:
        return False
    return find(row.consumer, row.message_id, using) is not None


@dataclass(frozen=True)
class Keeping:
    """What a purge at ``now`` keeps of the completed rows it deletes: each consumer's
    tombstone retention (the configured ones, and the global one for every other)."""

    now: datetime
    configured: dict[str, float | None]
    default: float | None

    @classmethod
    def at(cls, now: datetime) -> Keeping:
        return cls(
            now,
            {name: retention(name) for name in inbox_settings.consumers},
            inbox_settings.tombstone_retention,
        )

    def kept(self, rows: Any) -> Any:
        """Those of ``rows`` (a queryset of inbox rows) whose consumer keeps tombstones."""
        if self.default is None:
            keeping = [name for name, seconds in self.configured.items() if seconds is not None]
            return rows.filter(consumer__in=keeping)
        return rows.exclude(
            consumer__in=[name for name, seconds in self.configured.items() if seconds is None]
        )

    def seconds_sql(self, column: str) -> tuple[str, list[Any]]:
        """SQL of the seconds a row of consumer ``column`` keeps its tombstone (``NULL``:
        none), and its parameters."""
        params: list[Any] = []
        cases = ""
        for name, seconds in self.configured.items():
            cases += " WHEN %s THEN %s::float8"
            params += [name, seconds]
        if not cases:
            return "%s::float8", [self.default]
        return f"CASE {column}{cases} ELSE %s::float8 END", [*params, self.default]


def write(gone: Iterable[tuple[str, str, datetime | None]], keep: Keeping, using: str) -> int:
    """Keep a tombstone of each purged ``(consumer, message_id, processed_at)`` whose consumer
    keeps them; return how many were written (a pair's earlier tombstone is replaced)."""
    stones: dict[uuid.UUID, InboxTombstone] = {}
    now = keep.now
    for consumer, message_id, completed_at in gone:
        seconds = keep.configured.get(consumer, keep.default)
        if seconds is None:
            continue
        key = digest(consumer, message_id)
        stones[key] = InboxTombstone(
            digest=key,
            completed_at=completed_at,
            purged_at=now,
            expires_at=now + timedelta(seconds=seconds),
        )
    if stones:
        # MySQL and MariaDB take no conflict target: the primary key is their only unique key.
        target = connections[using].features.supports_update_conflicts_with_target
        InboxTombstone.objects.using(using).bulk_create(
            list(stones.values()),
            update_conflicts=True,
            unique_fields=["digest"] if target else None,
            update_fields=["completed_at", "purged_at", "expires_at"],
        )
    return len(stones)


def expire(now: datetime, limit: int, using: str) -> int:
    """Delete up to ``limit`` tombstones that expired before ``now``; return how many."""
    expired = InboxTombstone.objects.using(using).filter(expires_at__lt=now)
    digests = list(expired.values_list("digest", flat=True)[:limit])
    if not digests:
        return 0
    gone = InboxTombstone.objects.using(using).filter(digest__in=digests, expires_at__lt=now)
    return int(gone.delete()[0])


def expired_count(now: datetime, using: str) -> int:
    """How many tombstones expired before ``now`` (what a dry run reports)."""
    return InboxTombstone.objects.using(using).filter(expires_at__lt=now).count()
