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
reaches it (:func:`django_inbox.ordered.gaps.park_expired_gaps`), with a ``past_gap`` history entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from .. import clock, history
from ..conf import inbox_settings
from ..families import family
from ..models import InboxKey, InboxMessage
from ..ordered import ordering, waits
from .actions import ActionOptions, ActionResult, options_of, report
from .rerun_plan import MAX_NOTES, NOT_APPLIED, KeyPlan, note, plan, starts, unplanned

Status = InboxMessage.Status


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


def rerun_key(consumer: str, key: str, first: int, entry: dict[str, Any], using: str) -> KeyPlan:
    """Re-run ``key`` from ``first`` (its own transaction): see the module's description.
    ``entry`` is the operator's ``replay`` history entry."""
    with transaction.atomic(using=using):
        key_plan = plan(consumer, key, first, using, lock=True)
        if not key_plan.runs:
            return key_plan
        now = clock.now()
        InboxKey.objects.using(using).filter(consumer=consumer, key=key).update(
            applied_sequence=key_plan.target, rerun_through=key_plan.through, updated_at=now
        )
        cleared = {"attempts": 0, "locked_until": None, "lease_id": "", "processed_at": None}
        due: list[InboxMessage] = []
        waiting: list[InboxMessage] = []
        for row in key_plan.runs:
            assert row.sequence is not None
            (due if row.sequence == key_plan.target + 1 else waiting).append(row)
        changes = {**cleared, "status": Status.RECEIVED, "next_attempt_at": now}
        _change(due, {**changes, "last_error": ""}, entry, now, using)
        planned = {row.sequence for row in (*key_plan.runs, *key_plan.skips)}

        def look(sequence: int) -> datetime | None:
            # Behind a version of the re-run (or one still to run), no sweep looks: that
            # version releases it. After a sequence no version holds, the gap sweep looks
            # often: it moves the key past the hole as soon as the key reaches it, as the first
            # run was moved past it.
            if sequence - 1 in planned or waits.predecessor_exists(
                consumer, key, sequence - 1, using, through=key_plan.through
            ):
                return None
            return now + timedelta(seconds=waits.HOLE_LOOK)

        for row in waiting:  # one reason per row: what it waits for
            assert row.sequence is not None
            reason = f"re-run: waits for sequence {row.sequence - 1} of key {key!r} to run again"
            changes = {**cleared, "status": Status.WAITING, "next_attempt_at": look(row.sequence)}
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
                "next_attempt_at": look(row.sequence),
                "processed_at": None,
                "skip_requested": True,
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
    family(using).change_appending_history(rows, {**changes, "rerun": True}, entry, now, using)


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
        "replay",
        at=clock.now(),
        actor=actor,
        reason=reason,
        previous_status="",
        attempts=0,
        via=via,
    )
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


# -- how far a re-run has got: what ``inbox_replay --wait`` follows ---------------------------
#
# Each count takes ``pks``, the rows one re-run changed, so that following a re-run counts that
# re-run alone, not every re-run row of its consumers (rows left behind by an earlier one, or
# another operator's meanwhile).

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
