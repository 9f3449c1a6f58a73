"""What ``inbox_stats``, the health view and the metrics report as problems: dead rows, rows
stuck past their lease, a due row waiting too long, and the outbox's dead rows and lag."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..models import InboxMessage

if TYPE_CHECKING:
    from .stats import ConsumerStats

Status = InboxMessage.Status

#: Kinds of :class:`Problem`, in the order they are reported.
PROBLEM_KINDS = ("dead", "stuck", "pending_age", "outbox_dead", "outbox_lag")


@dataclass
class Problem:
    kind: str
    consumer: str
    value: float
    message: str


def outbox_problems(outbox: Any, max_pending_age: float, ignore: tuple[str, ...]) -> list[Problem]:
    from ..outbox.services import problems

    return [
        Problem(kind, "", value, message)
        for kind, value, message in problems(outbox, max_pending_age)
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
    return problems
