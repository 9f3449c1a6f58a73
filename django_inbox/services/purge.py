"""``purge()`` behind ``inbox_purge``: delete finished rows once their retention has passed.

Only ``completed`` rows (by ``processed_at``) and ``dead`` rows (by ``updated_at``, only when
a dead retention is set or an age is given) are ever deleted. Rows still to be processed or
set aside for an operator (``received``, ``in_progress``, ``failed``, ``parked``) never are.

Deletion walks the table in primary-key order, one short transaction per batch (on
PostgreSQL ``DELETE … WHERE id = ANY(ARRAY(SELECT … ORDER BY id LIMIT n FOR UPDATE SKIP
LOCKED))``), so it never holds locks for long, never waits for a row someone else holds, and
each batch starts where the previous one ended instead of rescanning what was already deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q

from .. import clock, lifecycle
from ..conf import inbox_settings
from ..db import tombstones
from ..families import family
from ..models import InboxMessage
from ..ordered import gaps
from .rerun import ordered_consumers

Status = InboxMessage.Status

#: The statuses :func:`purge` may delete (the row's life, :mod:`django_inbox.lifecycle`), and
#: the column their age is measured from. Stale versions an ordered consumer skipped are done,
#: kept as long as completed rows.
PURGEABLE = {
    status: "updated_at" if status == Status.DEAD else "processed_at"
    for status in lifecycle.sources("purge")
}


@dataclass
class PurgeProgress:
    """Where a running purge is; passed to the ``progress`` callback after every batch."""

    deleted: int
    batches: int
    elapsed: float

    @property
    def rate(self) -> float:
        """Rows deleted per second so far."""
        return self.deleted / self.elapsed if self.elapsed > 0 else 0.0


@dataclass
class PurgeResult:
    """What :func:`purge` deleted (or, with ``dry_run``, would delete), per status."""

    deleted: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    elapsed: float = 0.0
    dry_run: bool = False
    #: Statuses skipped because no retention applies to them (``dead`` without a dead retention).
    skipped: list[str] = field(default_factory=list)
    #: Dead versions of re-runs kept: each holds its key's rebuild until an operator replays
    #: or skips it.
    held: int = 0
    #: Tombstones written for the completed rows deleted (with ``dry_run``: to be written).
    tombstones_written: int = 0
    #: Expired tombstones deleted (with ``dry_run``: to be deleted).
    tombstones_expired: int = 0

    @property
    def total(self) -> int:
        return sum(self.deleted.values())

    @property
    def rate(self) -> float:
        return self.total / self.elapsed if self.elapsed > 0 else 0.0


def _retention(status: str, consumer: str | None) -> float | None:
    """The retention of ``status`` rows of ``consumer`` (``None``: the global setting)."""
    if consumer is None:
        completed, dead = inbox_settings.retention, inbox_settings.dead_retention
    else:
        policy = inbox_settings.policy(consumer)
        completed, dead = policy.retention, policy.dead_retention
    return dead if status == Status.DEAD else completed


def _check_purgeable(status: str) -> None:
    if status not in PURGEABLE:
        raise ValueError(
            f"only {', '.join(PURGEABLE)} rows can be purged, not {status!r}: the others are "
            "still to be processed or are waiting for an operator"
        )


def expired(
    status: str,
    *,
    older_than: float | None = None,
    consumer: str | None = None,
    now: datetime | None = None,
) -> Any:
    """The rows of ``status`` whose retention has passed, or ``None`` if none can expire.

    ``older_than`` (seconds) replaces every consumer's retention. Otherwise each consumer's
    own retention applies (``INBOX_CONSUMERS[name]["retention"]`` / ``["dead_retention"]``
    over ``INBOX_RETENTION`` / ``INBOX_DEAD_RETENTION``).
    """
    _check_purgeable(status)
    now = now or clock.now()
    column = PURGEABLE[Status(status)]
    rows = InboxMessage.objects.using(inbox_settings.database).filter(status=status)
    rows = rows.for_consumer(consumer)

    def older(seconds: float) -> Q:
        return Q(**{f"{column}__lt": now - timedelta(seconds=seconds)})

    if older_than is not None:
        return rows.filter(older(older_than))
    if consumer is not None:
        retention = _retention(status, consumer)
        return None if retention is None else rows.filter(older(retention))
    # Consumers with a policy of their own, then everyone else under the global setting.
    configured = list(inbox_settings.consumers)
    condition = Q(pk__in=[])
    for name in configured:
        retention = _retention(status, name)
        if retention is not None:
            condition |= Q(consumer=name) & older(retention)
    retention = _retention(status, None)
    if retention is not None:
        condition |= ~Q(consumer__in=configured) & older(retention)
    if condition == Q(pk__in=[]):
        return None
    return rows.filter(condition)


def purge(
    *,
    statuses: tuple[str, ...] | None = None,
    older_than: float | None = None,
    consumer: str | None = None,
    batch_size: int = 1000,
    dry_run: bool = False,
    progress: Callable[[PurgeProgress], None] | None = None,
    pause: float = 0.0,
) -> PurgeResult:
    """Delete rows of ``statuses`` whose retention has passed; return the counts.

    By default (``statuses=None``) ``completed`` rows past their retention (or
    ``older_than``) go, and ``dead`` rows only past a configured dead retention: dead letters
    nobody has looked at are never deleted by an age given for completed rows. Name ``dead``
    in ``statuses`` to apply ``older_than`` to them as well. ``older_than`` (seconds) replaces
    the configured retentions of the statuses it applies to. ``pause`` sleeps between
    batches, to leave the database more room on a busy system. With ``dry_run`` nothing is
    deleted and the counts say what would be.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    explicit = statuses is not None
    statuses = tuple(statuses) if statuses is not None else tuple(PURGEABLE)
    for status in statuses:  # refuse before anything is deleted, not halfway through
        _check_purgeable(status)
    result = PurgeResult(dry_run=dry_run)
    started = time.monotonic()
    now = clock.now()
    for status in statuses:
        age = older_than if explicit or status != Status.DEAD else None
        rows = expired(status, older_than=age, consumer=consumer, now=now)
        if rows is None:
            result.skipped.append(str(status))
            continue
        if status == Status.DEAD:
            # A dead version of a re-run holds its key's rebuild: an operator replays or
            # skips it; purged, the re-run would pass it as if its first run had.
            held = rows.filter(versions() & Q(rerun=True))
            result.held = held.count()
            rows = rows.exclude(versions() & Q(rerun=True))
        if dry_run:
            result.deleted[str(status)] = rows.count()
            if status == Status.COMPLETED:
                result.tombstones_written = tombstones.Keeping.at(now).kept(rows).count()
            continue
        result.deleted[str(status)] = 0
        if status == Status.DEAD:
            result.deleted[str(status)] += _delete_dead_versions(rows.filter(versions()))
            rows = rows.exclude(versions())
        pages = family(inbox_settings.database).purge_pages(rows, inbox_settings.database)
        last_pk = 0
        while pages is not None:
            deleted, stones = _delete_batch(pages.filter(pk__gt=last_pk), status, batch_size)
            if not deleted:
                break
            last_pk = max(deleted)
            result.deleted[str(status)] += len(deleted)
            result.tombstones_written += stones
            result.batches += 1
            if progress is not None:
                progress(PurgeProgress(result.total, result.batches, time.monotonic() - started))
            if pause:
                time.sleep(pause)
    result.tombstones_expired = _expire_tombstones(now, batch_size, dry_run, pause)
    if not explicit and not result.deleted.get(Status.SKIPPED):
        # Only ordered consumers have skipped rows: don't report them to everyone else.
        result.deleted.pop(str(Status.SKIPPED), None)
    result.elapsed = time.monotonic() - started
    return result


def versions() -> Q:
    """Ordered consumers' versions (a key and a sequence)."""
    return Q(sequence__isnull=False) & ~Q(key="") & ordered_consumers()


def _delete_dead_versions(rows: Any) -> int:
    """Delete dead versions of ordered keys one at a time, each under its key's lock
    (:func:`~django_inbox.ordered.gaps.delete_dead_version`)."""
    using = inbox_settings.database
    found = rows.order_by("pk").values_list("pk", "consumer", "key", "sequence")
    return sum(
        gaps.delete_dead_version(pk, consumer, key, sequence, using)
        for pk, consumer, key, sequence in found.iterator()
    )


def _delete_batch(rows: Any, status: str, limit: int) -> tuple[list[int], int]:
    """Delete the first ``limit`` rows of ``rows`` by pk, skipping locked ones, and keep the
    tombstones of the completed ones in the same transaction; return the pks and the number
    of tombstones written."""
    using = inbox_settings.database
    keep = tombstones.Keeping.at(clock.now()) if status == Status.COMPLETED else None
    with transaction.atomic(using=using):
        return family(using).delete_batch(rows, status, limit, using, keep)


def _expire_tombstones(now: datetime, limit: int, dry_run: bool, pause: float) -> int:
    """Delete the tombstones expired before ``now`` in batches of ``limit``; return how many."""
    using = inbox_settings.database
    if dry_run:
        return tombstones.expired_count(now, using)
    total = 0
    while True:
        with transaction.atomic(using=using):
            done = tombstones.expire(now, limit, using)
        total += done
        if done < limit:
            return total
        if pause:
            time.sleep(pause)
