"""How far a re-run has got: what ``inbox_replay --wait`` follows."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef

from ..conf import inbox_settings
from ..models import InboxMessage

Status = InboxMessage.Status


#: Statuses of a re-run row that has still to run.
LEFT = (Status.RECEIVED, Status.IN_PROGRESS, Status.FAILED, Status.WAITING)


def rerun_left(consumers: list[str]) -> int:
    """How many re-run rows of ``consumers`` have still to run (progress of a rebuild)."""
    using = inbox_settings.database
    return (
        InboxMessage.objects.using(using)
        .filter(consumer__in=consumers, rerun=True, status__in=LEFT)
        .count()
    )


def rerun_blocked(consumers: list[str]) -> int:
    """How many re-run rows of ``consumers`` wait behind a dead or parked version of their key
    (an operator must replay or skip it before they can run)."""
    using = inbox_settings.database
    blocker = InboxMessage.objects.using(using).filter(
        consumer=OuterRef("consumer"),
        key=OuterRef("key"),
        sequence__lt=OuterRef("sequence"),
        status__in=(Status.DEAD, Status.PARKED),
    )
    return (
        InboxMessage.objects.using(using)
        .filter(consumer__in=consumers, rerun=True, status=Status.WAITING)
        .filter(Exists(blocker))
        .count()
    )


def rerun_failed(consumers: list[str], *, since: datetime) -> int:
    """How many re-run rows of ``consumers`` went dead or parked since ``since``."""
    using = inbox_settings.database
    return (
        InboxMessage.objects.using(using)
        .filter(
            consumer__in=consumers,
            rerun=True,
            status__in=(Status.DEAD, Status.PARKED),
            updated_at__gte=since,
        )
        .count()
    )
