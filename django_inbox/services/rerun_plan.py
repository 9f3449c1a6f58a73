"""What a re-run of an ordered key changes (:mod:`.rerun` carries it out): the versions to run
and skip again, the sequences no version holds, and what the operator is told."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db.models import Count, Min, QuerySet

from ..db.statements import KeyState
from ..models import InboxKey, InboxMessage
from ..ordered import ordering

Status = InboxMessage.Status

#: Notes kept per re-run (one per key that needs one); the rest are counted.
MAX_NOTES = 20


@dataclass
class KeyPlan:
    """What re-running one key from ``first`` changes."""

    consumer: str
    key: str
    first: int
    #: The key's applied sequence now, and after the rewind.
    applied: int
    target: int
    #: Completed versions to run again, and skipped ones to skip again, by sequence.
    runs: list[InboxMessage] = field(default_factory=list)
    skips: list[InboxMessage] = field(default_factory=list)
    #: Sequences between ``first`` and ``applied`` with no version to run or skip.
    holes: list[int] = field(default_factory=list)
    selected: int = 0
    #: Where the key stands once the re-run is over (``InboxKey.rerun_through``): until then,
    #: other copies of versions up to it are stale and later versions wait.
    through: int = 0


def starts(versions: QuerySet[InboxMessage]) -> list[dict[str, Any]]:
    """Per ``(consumer, key)`` of ``versions``: its lowest sequence and how many are selected."""
    found = (
        versions.order_by()
        .values("consumer", "key")
        .annotate(first=Min("sequence"), selected=Count("pk"))
        .order_by("consumer", "key")
    )
    return [dict(start) for start in found]


def plan(consumer: str, key: str, first: int, using: str, *, lock: bool) -> KeyPlan:
    """What a re-run of ``key`` from ``first`` would change; with ``lock``, under the key's
    lock and the rows' (the caller's transaction)."""
    if lock:
        state = ordering.lock(consumer, key, using, wait=True)
        assert state is not None  # waiting for the lock always gets it
    else:
        found = (
            InboxKey.objects.using(using)
            .filter(consumer=consumer, key=key)
            .values_list("applied_sequence", "rerun_through")
            .first()
        )
        state = KeyState(*found) if found is not None else KeyState(first - 1)
    applied = state.applied
    target = min(applied, first - 1)
    rows = (
        InboxMessage.objects.using(using)
        .filter(
            consumer=consumer,
            key=key,
            sequence__gte=first,
            sequence__lte=applied,
            status__in=(Status.COMPLETED, Status.SKIPPED),
        )
        .order_by("sequence", "pk")
    )
    if lock:
        rows = rows.select_for_update()
    by_sequence: dict[int, InboxMessage] = {}
    for row in rows:
        assert row.sequence is not None
        held = by_sequence.get(row.sequence)
        # One version per sequence: the completed one, else one an operator skipped.
        completed = row.status == Status.COMPLETED
        better = held is None or (completed and held.status != Status.COMPLETED)
        if better and (completed or _skipped_by_operator(row)):
            by_sequence[row.sequence] = row
    result = KeyPlan(
        consumer, key, first, applied, target, through=max(state.through or applied, applied)
    )
    for sequence in range(first, applied + 1):
        version = by_sequence.get(sequence)
        if version is None:
            result.holes.append(sequence)
        elif version.status == Status.COMPLETED:
            result.runs.append(version)
        else:
            result.skips.append(version)
    return result


def _skipped_by_operator(row: InboxMessage) -> bool:
    """A version an operator skipped (it counted as applied), not a stale duplicate."""
    return bool(row.skip_requested)


def unplanned(key_plan: KeyPlan) -> int:
    """Selected versions a re-run of the key cannot run: its key never applied them (they
    completed before the consumer was ordered, or the key's state was removed)."""
    return (
        max(key_plan.selected - len(key_plan.runs), 0) if key_plan.first > key_plan.applied else 0
    )


#: Why :func:`unplanned` versions are refused.
NOT_APPLIED = (
    "completed version its key has not applied (it completed before the consumer was "
    "ordered): the key has nothing to rewind"
)


def note(key_plan: KeyPlan) -> str | None:
    """What an operator should know about one key's re-run, if anything."""
    later = len(key_plan.runs) - key_plan.selected
    parts = []
    if later > 0:
        parts.append(f"{later:,} later completed version(s) re-run too, to keep the key's order")
    if key_plan.skips:
        parts.append(f"{len(key_plan.skips):,} skipped version(s) skipped again")
    if key_plan.holes:
        shown = ", ".join(str(sequence) for sequence in key_plan.holes[:5])
        more = "…" if len(key_plan.holes) > 5 else ""
        parts.append(
            f"sequence(s) {shown}{more} have no row (the first run passed them: they never "
            "arrived, or were purged); the re-run passes them too"
        )
    if not parts:
        return None
    return f"{key_plan.consumer} key {key_plan.key!r} from sequence {key_plan.first}: " + "; ".join(
        parts
    )
