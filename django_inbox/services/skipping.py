"""The operator's "skip this version" for ordered consumers (an action like those of
:mod:`.operator`, with its own transaction per row under the key's lock)."""

from __future__ import annotations

from typing import Unpack

from django.db import transaction
from django.db.models import QuerySet

from .. import clock, events, history
from ..conf import inbox_settings
from ..models import InboxMessage
from ..ordered import ordering, rebuilds, waits
from .actions import ActionOptions, ActionResult, options_of
from .operator import SKIPPABLE

Status = InboxMessage.Status


def skip(rows: QuerySet[InboxMessage], **options: Unpack[ActionOptions]) -> ActionResult:
    """Skip versions of an ordered consumer ("skip this version"): the rows go ``skipped``
    without running, with the operator's history entry. A skipped version that is its key's
    next one counts as applied, so the key's following version runs. Rows without a
    sequence, of consumers that are not ordered, or being processed are refused.

    Each row is decided in its own transaction holding its key's lock (taken before the row's,
    in the order workers take them).
    """
    actor, reason, via, dry_run, keep = options_of("skip", options)
    using = inbox_settings.database
    result = ActionResult(action="skip", dry_run=dry_run)
    candidates = (
        rows.using(using).order_by("pk").values_list("pk", "consumer", "key", "sequence", "status")
    )
    for pk, consumer, key, sequence, status in candidates.iterator():
        if status not in SKIPPABLE:
            result.refused[f"{status} (cannot skip from {status})"] += 1
            continue
        if sequence is None or not ordering.applies(consumer, key):
            result.refused["not a version (key and sequence) of an ordered consumer"] += 1
            continue
        if dry_run:
            result.changed[status] += 1
            continue
        skipped = _skip_one(pk, consumer, key, sequence, actor, reason, via, using)
        if skipped is None:
            result.refused["changed meanwhile (being processed, or already resolved)"] += 1
            continue
        result.changed[skipped.status] += 1
        if keep is None or len(result.rows) < keep:
            result.rows.append((pk, consumer, skipped.message_id, skipped.status))
    return result


def _skip_one(
    pk: int,
    consumer: str,
    key: str,
    sequence: int,
    actor: str,
    reason: str,
    via: str,
    using: str,
) -> InboxMessage | None:
    with transaction.atomic(using=using):
        state = ordering.lock(consumer, key, using, wait=True)
        row = (
            InboxMessage.objects.using(using)
            .select_for_update()
            .filter(pk=pk, status__in=SKIPPABLE)
            .first()
        )
        if row is None or state is None:
            return None
        now = clock.now()
        entry = history.action_entry(
            "skip",
            at=now,
            actor=actor,
            reason=reason,
            previous_status=row.status,
            attempts=row.attempts,
            via=via,
        )
        said = ordering.skipped_reason(entry)
        if state.rebuilding and not row.rerun:  # a re-run with nothing left to run is over
            state, _ = rebuilds.finish_rebuild(consumer, key, state, now, using)
        verdict = ordering.decide(sequence, state, rerun=row.rerun)
        if verdict is ordering.Verdict.WAIT:
            # Ahead of its key: it waits, and is skipped (counting as applied) when the key
            # reaches it, so the versions after it are not held back by it. The request is
            # the row's state (``skip_requested``): what happens to the row meanwhile (a
            # failed attempt to record it, a gap, a re-run) does not undo it.
            InboxMessage.objects.using(using).filter(pk=pk).update(
                status=Status.WAITING,
                skip_requested=True,
                next_attempt_at=waits.deadline(
                    consumer,
                    key,
                    sequence,
                    now,
                    using,
                    rerun=row.rerun,
                    through=state.rebuild_through,
                ),
                updated_at=now,
                last_error=f"{said}; skipped when key {key!r} reaches sequence {sequence}",
                history=history.append(row.history, entry),
            )
            return row
        InboxMessage.objects.using(using).filter(pk=pk).update(
            status=Status.SKIPPED,
            skip_requested=True,
            next_attempt_at=None,
            processed_at=now,
            updated_at=now,
            last_error=said,
            history=history.append(row.history, entry),
        )
        if verdict is ordering.Verdict.RUN:
            ordering.advance(consumer, key, sequence, now, using)
            if row.rerun:  # the re-run's last version skipped: the re-run is over
                rebuilds.after_rerun(row, using)
    events.event(
        "skipped", **events.about(row, using), detail=f"by {actor} via {via}, was {row.status}"
    )
    return row
