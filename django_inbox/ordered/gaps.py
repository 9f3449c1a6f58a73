"""Ordered consumers' gaps: waiting versions whose predecessor never came are parked after
``gap_timeout`` (:func:`park_expired_gaps`, called by ``inbox_process`` and ``inbox_reclaim``),
and an operator's replay of one moves its key past the gap (:func:`jump_gap`). Every decision
is taken under the key's lock, as in :mod:`django_inbox.ordered.ordering`."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Exists, F, Min, OuterRef, QuerySet

from .. import clock, events, history
from ..conf import inbox_settings
from ..db.aside import with_status
from ..models import InboxKey, InboxMessage
from .ordering import Verdict, decide, lock, release_next, skip_entry, skipped_reason, stale_reason
from .rebuilds import finish_rebuild
from .waits import HOLE_LOOK, RUNNABLE, predecessor_exists, versions_that_can_run

Status = InboxMessage.Status

#: ``last_error`` of a row parked because its gap was never filled starts with this.
GAP_PREFIX = "gap: "
#: Waiting rows looked at per sweep.
SWEEP_BATCH = 500


def jump_gap(pk: int, consumer: str, key: str, sequence: int, using: str) -> int | None:
    """An operator replayed a version parked for a gap: move the key's applied sequence up to
    just below it, or just below the lowest version between that can still run (so nothing
    that did arrive is passed over), and record it in the row's history. While a re-run of
    the key is under way, the key goes there when the re-run ends (``rerun_through`` moves
    instead). Returns the new applied sequence, or ``None`` if nothing was passed over (its
    own transaction)."""
    with transaction.atomic(using=using):
        state = lock(consumer, key, using, wait=True)
        if state is None:
            return None
        now = clock.now()
        state, _ = finish_rebuild(consumer, key, state, now, using)
        through = state.rebuild_through
        base = state.applied if through is None else through
        if sequence <= base + 1:
            return None
        lowest = (
            versions_that_can_run(consumer, key, using, through=through)
            .filter(sequence__gt=base, sequence__lt=sequence)
            .aggregate(lowest=Min("sequence"))["lowest"]
        )
        target = sequence - 1 if lowest is None else lowest - 1
        if target <= base:
            return None
        moved = {"applied_sequence": target} if through is None else {"rerun_through": target}
        InboxKey.objects.using(using).filter(consumer=consumer, key=key).update(
            **moved, updated_at=now
        )
        row = InboxMessage.objects.using(using).select_for_update().filter(pk=pk).first()
        if row is not None:
            after = "" if through is None else " (after the re-run under way)"
            entry = {
                "kind": "past_gap",
                "at": now.isoformat(),
                "message": (
                    f"replayed past the gap{after}: sequences {base + 1} to {target} of key "
                    f"{key!r} never arrived; should they, they are skipped as stale"
                ),
            }
            InboxMessage.objects.using(using).filter(pk=pk).update(
                history=history.append(row.history, entry)
            )
        if through is None:
            release_next(consumer, key, target + 1, now, using)
    return target


def _versions_between(
    found: InboxMessage, missing: int, using: str, *, through: int | None
) -> bool:
    """Whether a version of ``found``'s key that can still run holds a sequence from
    ``missing`` up to just below ``found`` (a re-run goes on past the others: completed rows
    are not between, stale copies never ran, the re-run planner passes them too)."""
    assert found.sequence is not None
    return (
        versions_that_can_run(found.consumer, found.key, using, through=through)
        .filter(sequence__gte=missing, sequence__lt=found.sequence)
        .exists()
    )


def _rerun_past(found: InboxMessage, applied: int, now: datetime, using: str) -> None:
    """Move ``found``'s key to just below it and make it due (the caller holds the key)."""
    assert found.sequence is not None
    target = found.sequence - 1
    InboxKey.objects.using(using).filter(consumer=found.consumer, key=found.key).update(
        applied_sequence=target, updated_at=now
    )
    entry = {
        "kind": "past_gap",
        "at": now.isoformat(),
        "message": (
            f"re-run past sequences {applied + 1} to {target} of key {found.key!r}, which "
            "its first run passed too (they never arrived, or were purged)"
        ),
    }
    with_status(InboxMessage.objects.using(using).filter(pk=found.pk), Status.WAITING).update(
        status=Status.RECEIVED,
        next_attempt_at=now,
        updated_at=now,
        last_error="",
        history=history.append(found.history, entry),
    )


def park_expired_gaps(using: str | None = None, *, consumer: str | None = None) -> int:
    """Look at ``waiting`` rows past their gap deadline: park those whose missing sequence
    never arrived (``last_error`` names the key and the sequence), release those whose
    predecessor has been applied meanwhile, and stop looking at those behind a predecessor
    that exists (it releases them, or an operator resolves it). A changed ``gap_timeout``
    applies to rows already waiting (:func:`apply_gap_timeout`). Returns how many rows were
    parked. Called by ``inbox_process`` and ``inbox_reclaim``."""
    using = using or inbox_settings.database
    now = clock.now()
    if consumer is not None:
        apply_gap_timeout(consumer, now, using)
    rows = expired_waiting(using, consumer=consumer, now=now)
    due = list(rows.order_by("next_attempt_at").values_list("pk", flat=True)[:SWEEP_BATCH])
    parked = 0
    for pk in due:
        parked += _look_at_waiting(pk, now, using)
    return parked


def apply_gap_timeout(consumer: str, now: datetime, using: str) -> int:
    """Bring forward the gap deadlines of ``consumer``'s waiting rows set under a longer
    ``gap_timeout`` than today's (a longer one is applied when a row's deadline comes, by
    :func:`_look_at_waiting`). One probe of the waiting rows' index; returns the rows moved."""
    timeout = timedelta(seconds=inbox_settings.policy(consumer).gap_timeout)
    return (
        InboxMessage.objects.using(using)
        .filter(status=Status.WAITING, consumer=consumer, next_attempt_at__gt=now + timeout)
        .update(next_attempt_at=F("updated_at") + timeout)
    )


def delete_dead_version(pk: int, consumer: str, key: str, sequence: int, using: str) -> bool:
    """Delete a ``dead`` version of an ordered key (``inbox_purge``), under the key's lock, and
    give the versions waiting right behind it a gap deadline due now (nothing else would
    release them; the sweep decides them, and parks them if the gap stays open). Under the
    lock, no decision about the key can see the row and commit after it is gone."""
    with transaction.atomic(using=using):
        lock(consumer, key, using, wait=True)
        gone, _ = InboxMessage.objects.using(using).filter(pk=pk, status=Status.DEAD).delete()
        if gone:
            now = clock.now()
            InboxMessage.objects.using(using).filter(
                consumer=consumer,
                key=key,
                sequence=sequence + 1,
                status=Status.WAITING,
                next_attempt_at__isnull=True,
            ).update(next_attempt_at=now, updated_at=now)
    return bool(gone)


def rearm_orphans(using: str | None = None, *, consumer: str | None = None) -> int:
    """Give a gap deadline (due now) to ``waiting`` rows that wait behind a predecessor no
    longer there to release them (deleted by hand, or by a release before ``inbox_purge``
    took the key's lock): the sweep then decides them. Called by ``inbox_reclaim`` and every
    few minutes by ``inbox_process``; reads every waiting row without a deadline, once."""
    using = using or inbox_settings.database
    predecessor = InboxMessage.objects.using(using).filter(
        consumer=OuterRef("consumer"),
        key=OuterRef("key"),
        sequence=OuterRef("sequence") - 1,
        status__in=RUNNABLE,
    )
    rows = InboxMessage.objects.using(using).filter(
        status=Status.WAITING, next_attempt_at__isnull=True
    )
    if consumer is not None:
        rows = rows.filter(consumer=consumer)
    orphans = list(rows.filter(~Exists(predecessor)).values_list("pk", flat=True))
    now = clock.now()
    moved = 0
    for start in range(0, len(orphans), SWEEP_BATCH):
        batch = orphans[start : start + SWEEP_BATCH]
        moved += (
            InboxMessage.objects.using(using)
            .filter(pk__in=batch, status=Status.WAITING, next_attempt_at__isnull=True)
            .update(next_attempt_at=now, updated_at=now)
        )
    return moved


def expired_waiting(
    using: str, *, consumer: str | None = None, now: datetime | None = None
) -> QuerySet[InboxMessage]:
    """``waiting`` rows past their gap deadline (of ``consumer``, if given)."""
    rows = InboxMessage.objects.using(using).filter(
        status=Status.WAITING, next_attempt_at__lte=now or clock.now()
    )
    return rows if consumer is None else rows.filter(consumer=consumer)


def _look_at_waiting(pk: int, now: datetime, using: str) -> int:
    with transaction.atomic(using=using):
        found = with_status(InboxMessage.objects.using(using).filter(pk=pk), Status.WAITING).first()
        if found is None or found.sequence is None:
            return 0
        state = lock(found.consumer, found.key, using, wait=False)
        if state is None:
            return 0  # busy: whoever holds the key decides; the next sweep looks again
        rows = with_status(InboxMessage.objects.using(using).filter(pk=pk), Status.WAITING)
        if state.rebuilding and not found.rerun:  # a re-run with nothing left to run is over
            state, _ = finish_rebuild(found.consumer, found.key, state, now, using)
        verdict = decide(found.sequence, state, rerun=found.rerun)
        if verdict is Verdict.RUN:
            rows.update(status=Status.RECEIVED, next_attempt_at=now, updated_at=now)
            return 0
        if verdict is Verdict.SKIP:
            rows.update(
                status=Status.SKIPPED,
                next_attempt_at=None,
                updated_at=now,
                processed_at=now,
                last_error=stale_reason(found.key, found.sequence, state, rerun=found.rerun),
            )
            return 0
        through = state.rebuild_through
        if (through is not None and not found.rerun and found.sequence == through + 1) or (
            predecessor_exists(
                found.consumer, found.key, found.sequence - 1, using, through=through
            )
        ):
            # Behind a version that can still run (or right behind a re-run under way): it
            # releases this one when its key applies it (or an operator resolves it). No
            # deadline: the sweep never looks again.
            rows.update(next_attempt_at=None, updated_at=now)
            return 0
        base = through if through is not None and not found.rerun else state.applied
        missing = base + 1
        if found.rerun:
            # A re-run is never parked for a gap: every sequence below it was passed once.
            # Versions between still to run again come first; sequences no version that can
            # run holds (they never arrived, were purged, or were stale) it goes on past, as
            # the first run did.
            if _versions_between(found, missing, using, through=through):
                rows.update(next_attempt_at=now + timedelta(seconds=HOLE_LOOK), updated_at=now)
            else:
                _rerun_past(found, state.applied, now, using)
            return 0
        timeout = inbox_settings.policy(found.consumer).gap_timeout
        waited_since = found.updated_at
        if waited_since + timedelta(seconds=timeout) > now:  # gap_timeout was made longer
            rows.update(next_attempt_at=waited_since + timedelta(seconds=timeout))
            return 0
        reason = (
            f"{GAP_PREFIX}key {found.key!r} is missing sequence {missing} (applied: {base}; "
            f"this is {found.sequence}); it did not arrive within {timeout:g}s. Replay this "
            "message to run it past the gap, or deliver the missing one and replay"
        )
        if found.skip_requested:
            reason += f" (an operator skipped it: {skipped_reason(skip_entry(found))}; it is "
            reason += "skipped, not run, once the gap is passed)"
        entry = {"kind": "gap", "at": now.isoformat(), "message": reason, "missing": missing}
        parked = rows.update(
            status=Status.PARKED,
            next_attempt_at=None,
            updated_at=now,
            last_error=reason,
            history=history.append(found.history, entry),
        )
    if not parked:
        return 0  # another sweep decided it meanwhile
    events.event(
        "parked", **events.about(found, using), error_type="Gap", detail=f"missing {missing}"
    )
    return 1
