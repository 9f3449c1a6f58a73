"""How far a re-run has got: what ``inbox_replay --wait`` follows.

Each count takes ``pks``, the rows one re-run changed, so that following a re-run counts that
re-run alone, not every re-run row of its consumers (rows left behind by an earlier one, or
another operator's meanwhile).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Exists, OuterRef, QuerySet

from ..conf import inbox_settings
from ..models import InboxKey, InboxMessage

Status = InboxMessage.Status

#: Statuses of a re-run row that has still to run.
LEFT = (Status.RECEIVED, Status.IN_PROGRESS, Status.FAILED, Status.WAITING)
#: Primary keys per query when counting among given rows.
CHUNK = 10_000


def _count(rows: QuerySet[InboxMessage], pks: Iterable[int] | None) -> int:
    if pks is None:
        return rows.count()
    ids = list(pks)
    return sum(rows.filter(pk__in=ids[i : i + CHUNK]).count() for i in range(0, len(ids), CHUNK))


def _reruns(consumers: list[str]) -> QuerySet[InboxMessage]:
    return InboxMessage.objects.using(inbox_settings.database).filter(
        consumer__in=consumers, rerun=True
    )


def rerun_left(consumers: list[str], *, pks: Iterable[int] | None = None) -> int:
    """How many re-run rows of ``consumers`` (among ``pks``, if given) have still to run."""
    return _count(_reruns(consumers).filter(status__in=LEFT), pks)


def rerun_blocked(consumers: list[str], *, pks: Iterable[int] | None = None) -> int:
    """How many re-run rows of ``consumers`` (among ``pks``, if given) wait behind a dead or
    parked version of their key that the key has not passed (an operator must replay or skip
    it before they can run). Rows with a deadline are not counted: they move on their own."""
    using = inbox_settings.database
    ahead = InboxKey.objects.using(using).filter(
        consumer=OuterRef(OuterRef("consumer")),
        key=OuterRef(OuterRef("key")),
        applied_sequence__lt=OuterRef("sequence"),
    )
    blocker = InboxMessage.objects.using(using).filter(
        Exists(ahead),
        consumer=OuterRef("consumer"),
        key=OuterRef("key"),
        sequence__lt=OuterRef("sequence"),
        status__in=(Status.DEAD, Status.PARKED),
    )
    waiting = _reruns(consumers).filter(status=Status.WAITING, next_attempt_at__isnull=True)
    return _count(waiting.filter(Exists(blocker)), pks)


def rerun_failed(consumers: list[str], *, since: datetime, pks: Iterable[int] | None = None) -> int:
    """How many re-run rows of ``consumers`` (among ``pks``, if given) went dead or parked
    since ``since``."""
    rows = _reruns(consumers).filter(status__in=(Status.DEAD, Status.PARKED), updated_at__gte=since)
    return _count(rows, pks)
