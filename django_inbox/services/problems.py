"""What ``inbox_stats``, the health view and the metrics report as problems: dead rows, rows
stuck past their lease, a due row waiting too long, ordered keys held up, and the outbox's dead
rows and lag."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db.models import Count, Exists, OuterRef, Q

from .. import companions
from ..conf import inbox_settings
from ..db.counting import sample
from ..models import InboxKey, InboxMessage
from ..ordered.gaps import GAP_PREFIX

if TYPE_CHECKING:
    from .stats import ConsumerStats

Status = InboxMessage.Status

#: Kinds of :class:`Problem`, in the order they are reported.
PROBLEM_KINDS = ("dead", "stuck", "pending_age", "stalled", "outbox_dead", "outbox_lag")


@dataclass
class Problem:
    kind: str
    consumer: str
    value: float
    message: str


def outbox_problems(outbox: Any, max_pending_age: float, ignore: tuple[str, ...]) -> list[Problem]:
    """The problems in the outbox's stats ``outbox`` (none without the outbox installed)."""
    companion = companions.outbox()
    if companion is None:
        return []
    return [
        Problem(kind, "", value, message)
        for kind, value, message in companion.problems(outbox, max_pending_age)
        if kind not in ignore
    ]


def consumer_problems(
    found: dict[str, ConsumerStats], max_pending_age: float, ignore: tuple[str, ...]
) -> list[Problem]:
    problems: list[Problem] = []
    for name, stats in sorted(found.items()):
        dead = stats.counts[Status.DEAD] or 0
        if dead and "dead" not in ignore:
            problems.append(
                Problem("dead", name, dead, f"{name}: {dead} dead message(s) need an operator")
            )
        if stats.stuck and "stuck" not in ignore:
            problems.append(
                Problem(
                    "stuck",
                    name,
                    stats.stuck,
                    f"{name}: {stats.stuck} message(s) in progress past their lease "
                    "(worker died or hangs; inbox_reclaim or a running worker recovers them)",
                )
            )
        age = stats.oldest_pending_age
        if age > max_pending_age and "pending_age" not in ignore:
            problems.append(
                Problem(
                    "pending_age",
                    name,
                    round(age, 3),
                    f"{name}: a due message has waited {age:.0f}s for a worker "
                    f"(limit {max_pending_age:.0f}s); are workers running?",
                )
            )
        stalled = _stalled(name, stats)
        if stalled is not None and "stalled" not in ignore:
            problems.append(stalled)
    return problems


def _stalled(name: str, stats: ConsumerStats) -> Problem | None:
    """Ordered keys that do not move until an operator acts, or waiting rows no worker
    sweeps."""
    parts = []
    if stats.stalled_keys:
        parts.append(
            f"{stats.stalled_keys} key(s) held up by a version parked for a gap or by a dead or "
            "parked version with later versions waiting (replay or skip it)"
        )
    if stats.overdue_waiting:
        parts.append(
            f"{stats.overdue_waiting} waiting version(s) past their gap deadline that no worker "
            "looked at (are workers running?)"
        )
    if not parts:
        return None
    value = stats.stalled_keys + stats.overdue_waiting
    return Problem("stalled", name, value, f"{name}: " + "; ".join(parts))


def held_up(rows: Any, found: dict[str, ConsumerStats], overdue: datetime, of: Any) -> None:
    """Ordered consumers' keys held up until an operator acts: a ``dead`` or ``parked``
    version above its key's applied sequence that is parked for a gap, or has the next version
    waiting right behind it; and waiting rows no sweep looked at. Each dead or parked version
    costs two probes of indexes (the key's row, the next version), found through the
    attention rows' index. Neither is asked for when no ordered consumer has dead or parked
    rows, or no consumer has waiting rows."""
    ordered_with_problems = any(
        inbox_settings.ordered(name) and (stats.counts[Status.DEAD] or stats.counts[Status.PARKED])
        for name, stats in found.items()
    )
    waiting = any(stats.counts[Status.WAITING] for stats in found.values())
    if ordered_with_problems:
        _held(rows, of)
    if waiting:  # counted up to EXACT_UP_TO + 1 rows (a lower bound beyond)
        late = sample(
            rows.filter(status=Status.WAITING, next_attempt_at__lt=overdue), ("consumer",)
        )
        for late_row in late.groups:
            of(late_row["consumer"]).overdue_waiting = int(late_row["n"])


def _held(rows: Any, of: Any) -> None:
    """Keys held by a dead or parked version of an ordered consumer (see :func:`held_up`)."""
    from .rerun import ordered_consumers

    next_waiting = InboxMessage.objects.filter(
        consumer=OuterRef("consumer"),
        key=OuterRef("key"),
        sequence=OuterRef("sequence") + 1,
        status=Status.WAITING,
    )
    ahead = InboxKey.objects.filter(
        consumer=OuterRef("consumer"),
        key=OuterRef("key"),
        applied_sequence__lt=OuterRef("sequence"),
    )
    held = (
        rows.filter(status__in=(Status.DEAD, Status.PARKED), sequence__isnull=False)
        .exclude(key="")
        .filter(ordered_consumers())
        .filter(Exists(ahead))
        .filter(Q(last_error__startswith=GAP_PREFIX) | Exists(next_waiting))
        .values("consumer")
        .annotate(keys=Count("key", distinct=True))
    )
    for found_row in held:
        of(found_row["consumer"]).stalled_keys = found_row["keys"]
