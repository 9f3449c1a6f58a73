"""Forced re-runs of an ordered consumer's completed versions: each key rebuilt in order.

A key's completed versions cannot simply go back to ``received``: the key has applied them,
so a worker would skip them as stale, and running them in any order would break the order the
consumer promises. A re-run from version ``F`` of a key instead, in one transaction holding
the key's lock:

- rewinds the key's applied sequence to ``F - 1`` (never forward: a re-run already under
  way keeps its place);
- sends version ``F`` back to ``received`` and every later completed version of the key to
  ``waiting``, all marked as re-runs (:attr:`InboxMessage.rerun`), so they run one at a time
  in sequence order, each released by its predecessor's commit, as the first time;
- sends the versions an operator skipped back to ``waiting`` with a skip request, so they are
  skipped again when the key reaches them.

Later versions are re-run even when the selection did not name them: the key's state is the
result of all of them, in order. Messages of the key that arrive meanwhile wait for the
re-run to catch up. A sequence no row holds (the first run was replayed past a gap there, or
its row was purged) is passed again: the gap sweep moves the key past it as soon as the key
reaches it (:func:`django_inbox.gaps.park_expired_gaps`), with a ``past_gap`` history entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, Min, Q, QuerySet
from django.utils import timezone

from .. import gaps, history, ordering
from ..conf import inbox_settings
from ..db import statements
from ..models import InboxKey, InboxMessage
from .actions import ActionOptions, ActionResult, options_of, report

Status = InboxMessage.Status

#: Notes kept per re-run (one per key that needs one); the rest are counted.
MAX_NOTES = 20


def ordered_consumers() -> Q:
    """The rows of ordered consumers, as the settings say (not as the rows say: a version
    completing meanwhile must land on the same side of :func:`split`)."""
    from ..conf import POLICY_KEYS

    if bool(inbox_settings._get(POLICY_KEYS["ordered"])):
        unordered = [c for c in inbox_settings.consumers if not inbox_settings.ordered(c)]
        return ~Q(consumer__in=unordered)
    return Q(consumer__in=[c for c in inbox_settings.consumers if inbox_settings.ordered(c)])


def split(rows: QuerySet[InboxMessage]) -> tuple[QuerySet[InboxMessage], QuerySet[InboxMessage]]:
    """``rows`` without, and only, the completed versions of ordered consumers. Both are
    evaluated when they are read, with the same condition, so a row completing between the two
    reads is in one of them, never in both and never in neither."""
    ordered = Q(status=Status.COMPLETED, sequence__isnull=False) & ~Q(key="") & ordered_consumers()
    return rows.exclude(ordered), rows.filter(ordered)


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
        applied = ordering.lock(consumer, key, using, wait=True)
        assert applied is not None  # waiting for the lock always gets it
    else:
        found = (
            InboxKey.objects.using(using)
            .filter(consumer=consumer, key=key)
            .values_list("applied_sequence", flat=True)
            .first()
        )
        applied = found if found is not None else first - 1
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
    result = KeyPlan(consumer, key, first, applied, target)
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
    return any(entry.get("kind") == "skip" for entry in row.history or [])


def rerun_key(consumer: str, key: str, first: int, entry: dict[str, Any], using: str) -> KeyPlan:
    """Re-run ``key`` from ``first`` (its own transaction): see the module's description.
    ``entry`` is the operator's ``replay`` history entry."""
    with transaction.atomic(using=using):
        key_plan = plan(consumer, key, first, using, lock=True)
        if not key_plan.runs:
            return key_plan
        now = timezone.now()
        deadline = ordering.gap_deadline(consumer, now)
        InboxKey.objects.using(using).filter(consumer=consumer, key=key).update(
            applied_sequence=key_plan.target, updated_at=now
        )
        cleared = {"attempts": 0, "locked_until": None, "lease_id": "", "processed_at": None}
        due: list[InboxMessage] = []
        waiting: list[InboxMessage] = []
        for row in key_plan.runs:
            assert row.sequence is not None
            (due if row.sequence == key_plan.target + 1 else waiting).append(row)
        changes = {**cleared, "status": Status.RECEIVED, "next_attempt_at": now}
        _change(due, {**changes, "last_error": ""}, entry, now, using)
        holes = set(key_plan.holes)
        soon = now + timedelta(seconds=gaps.HOLE_LOOK)
        for row in waiting:  # one reason per row: what it waits for
            assert row.sequence is not None
            reason = f"re-run: waits for sequence {row.sequence - 1} of key {key!r} to run again"
            # After a sequence no row holds, the gap sweep looks often: it moves the key past
            # the hole as soon as the key reaches it, as the first run was moved past it.
            look = soon if row.sequence - 1 in holes else deadline
            changes = {**cleared, "status": Status.WAITING, "next_attempt_at": look}
            _change([row], {**changes, "last_error": reason}, entry, now, using)
        skip_entry = {
            **entry,
            "kind": "skip",
            "reason": "skipped again by a re-run: an operator skipped it when it first ran",
        }
        for row in key_plan.skips:
            assert row.sequence is not None
            said = ordering.skipped_reason(skip_entry)
            changes = {
                "status": Status.WAITING,
                "next_attempt_at": deadline,
                "processed_at": None,
                "last_error": f"{said}; skipped when key {key!r} reaches sequence {row.sequence}",
            }
            _change([row], changes, skip_entry, now, using)
    return key_plan


def _change(
    rows: list[InboxMessage],
    changes: dict[str, Any],
    entry: dict[str, Any],
    now: datetime,
    using: str,
) -> None:
    """Change ``rows`` (locked, still in the status they were read in), appending ``entry``
    to each one's history and marking them as re-runs."""
    if not rows:
        return
    changes = {**changes, "rerun": True, "updated_at": now}
    if connections[using].vendor == "postgresql":
        statements.update_appending_history(
            [row.pk for row in rows], sorted({row.status for row in rows}), changes, entry, using
        )
        return
    for row in rows:
        InboxMessage.objects.using(using).filter(pk=row.pk, status=row.status).update(
            **changes,
            history=history.append(
                row.history, {**entry, "from": row.status, "attempts": row.attempts}
            ),
        )


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
    if key_plan.target < key_plan.first - 1:
        parts.append(f"joins a re-run under way (from sequence {key_plan.target + 1})")
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


def rerun_versions(
    versions: QuerySet[InboxMessage],
    refusal: Callable[[str], str | None],
    options: ActionOptions,
    result: ActionResult,
) -> None:
    """Re-run ordered consumers' completed versions, one key at a time (its own transaction)."""
    actor, reason, via, dry_run, keep = options_of("replay", options)
    using = inbox_settings.database
    entry = history.action_entry(
        "replay", at=timezone.now(), actor=actor, reason=reason, previous_status="", attempts=0,
        via=via,
    )  # fmt: skip
    for start in starts(versions):
        consumer, key, first = start["consumer"], start["key"], int(start["first"])
        refused = refusal(consumer)
        if refused is not None:
            result.refused[refused] += start["selected"]
            continue
        if dry_run:
            key_plan = plan(consumer, key, first, using, lock=False)
        else:
            key_plan = rerun_key(consumer, key, first, entry, using)
            report("replay", key_plan.runs, actor, via, reason, using)
        key_plan.selected = start["selected"]
        if unplanned(key_plan):
            result.refused[NOT_APPLIED] += unplanned(key_plan)
        for row in (*key_plan.runs, *key_plan.skips):
            result.changed[row.status] += 1
            if keep is None or len(result.rows) < keep:
                result.rows.append((row.pk, consumer, row.message_id, row.status))
        said = note(key_plan)
        if said is not None:
            if len(result.notes) < MAX_NOTES:
                result.notes.append(said)
            else:
                result.more_notes += 1
