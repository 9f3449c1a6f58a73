"""What every operator action shares: its keyword arguments (:class:`ActionOptions`), what it
reports back (:class:`ActionResult`), and the events it sends per changed row."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Required, TypedDict

from .. import events
from ..models import InboxMessage


@dataclass
class ActionResult:
    """What an action did (or, with ``dry_run``, would do)."""

    action: str
    dry_run: bool = False
    #: Rows changed, by the status they had.
    changed: Counter[str] = field(default_factory=Counter)
    #: Rows selected but left alone, by reason.
    refused: Counter[str] = field(default_factory=Counter)
    #: ``(pk, consumer, message_id, previous status)`` of the rows changed: the first ``keep``
    #: (all of them when ``keep`` is ``None``).
    rows: list[tuple[int, str, str, str]] = field(default_factory=list)
    #: What an operator should know (an ordered consumer's re-run, per key), and how many
    #: more such notes were left out.
    notes: list[str] = field(default_factory=list)
    more_notes: int = 0

    @property
    def total(self) -> int:
        return sum(self.changed.values())


class ActionOptions(TypedDict, total=False):
    """The keyword arguments every action takes (see the API reference)."""

    #: Who acts, for the history: ``user@host (command)``, ``alice (admin user 3)``.
    actor: Required[str]
    #: Why; kept in each changed row's history.
    reason: str
    #: Count what would change; change and lock nothing.
    dry_run: bool
    #: How: ``"command"``, ``"admin"``; ``"python"`` by default.
    via: str
    #: Rows locked and changed per transaction (500).
    batch_size: int
    #: How many changed rows :attr:`ActionResult.rows` lists (100; ``None``: all).
    keep: int | None


def options_of(action: str, options: ActionOptions) -> tuple[str, str, str, bool, int | None]:
    unknown = set(options) - set(ActionOptions.__annotations__)
    if unknown or "actor" not in options:
        raise TypeError(
            f"{action}: unexpected keyword argument(s) {sorted(unknown)!r}"
            if unknown
            else f"{action}: the keyword argument 'actor' is required"
        )
    return (
        options["actor"],
        options.get("reason", ""),
        options.get("via", "python"),
        options.get("dry_run", False),
        options.get("keep", 100),
    )


#: The event each action reports per row (retry now changes no status: no event).
_EVENTS = {"replay": "replayed", "park": "parked"}


def report(
    action: str, rows: list[InboxMessage], actor: str, via: str, reason: str, using: str
) -> None:
    kind = _EVENTS.get(action)
    if kind is None:
        return
    for row in rows:
        events.event(
            kind,
            **events.about(row, using),
            detail=f"by {actor} via {via}, was {row.status}",
            actor=actor,
            via=via,
            reason=reason,
            previous_status=row.status,
        )
