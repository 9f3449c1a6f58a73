"""Operator actions on stored rows: replay, park, retry now (skip: :mod:`.skipping`). Used by
commands, tasks and admin.

Every action changes rows in place (same row, same message id), only from the statuses it
allows, and appends an entry to each row's ``history`` naming who did it, how, when and why.
Rows are locked as they are changed and rows locked by someone else are skipped, so two
operators (or an operator and a worker) acting at once never change a row twice.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any, Unpack

from django.db import transaction
from django.db.models import Count, QuerySet

from .. import clock, history, lifecycle
from ..conf import inbox_settings
from ..families import family
from ..intake.storing import KEY_LOST
from ..models import InboxMessage
from ..ordered import gaps, ordering
from . import rerun
from .actions import ActionOptions as ActionOptions
from .actions import ActionResult as ActionResult
from .actions import options_of, report

Status = InboxMessage.Status

#: Statuses each action starts from (the row's life, :mod:`django_inbox.lifecycle`).
REPLAYABLE = lifecycle.sources("replay")
PARKABLE = lifecycle.sources("park")
RETRYABLE = lifecycle.sources("retry_now")
SKIPPABLE = lifecycle.sources("skip")


def replay(
    rows: QuerySet[InboxMessage], *, force: bool = False, **options: Unpack[ActionOptions]
) -> ActionResult:
    """Send ``dead`` and ``parked`` rows (and, with ``force``, ``completed`` ones) back to
    ``received``, due now, with a fresh set of attempts and their history kept.

    ``completed`` rows are refused unless ``force`` is given and the consumer's
    ``allow_replay_completed`` policy is on. A forced replay of a completed row is a re-run:
    the row is marked (:attr:`~django_inbox.models.InboxMessage.is_rerun`), its handler runs
    again, and its ``@side_effect`` calls follow the consumer's ``side_effects_on_rerun``
    policy. An ordered consumer's completed versions are re-run key by key in sequence order
    (:mod:`~django_inbox.services.rerun`). Rows in other statuses are refused: they are still
    being processed.
    """
    statuses: tuple[str, ...] = (*REPLAYABLE, Status.COMPLETED)

    def refusal(consumer: str) -> str | None:
        if not force:
            return (
                "completed (replaying it runs its handler again: only a forced re-run may, "
                "inbox_replay --force or the admin's re-run action)"
            )
        if not inbox_settings.policy(consumer).allow_replay_completed:
            return f"completed, and consumer {consumer!r} sets allow_replay_completed=False"
        return None

    def decide(row: InboxMessage) -> str | None:
        if row.last_error.startswith(f"{KEY_LOST}:") and inbox_settings.ordered(row.consumer):
            return (
                "kept dead without the key it named (unreadable, or too long to store): "
                "replayed, it would run outside its key's order; skip it"
            )
        if row.status in REPLAYABLE:
            return None
        if row.sequence is not None and ordering.applies(row.consumer, row.key):
            # Not from split() (the settings changed meanwhile): never without its key.
            return "completed version of an ordered consumer: select it again to re-run its key"
        return refusal(row.consumer)

    def change(now: datetime, status: str) -> dict[str, Any]:
        changes: dict[str, Any] = {
            "status": Status.RECEIVED,
            "attempts": 0,
            "next_attempt_at": now,
            "locked_until": None,
            "lease_id": "",
            "processed_at": None,
        }
        if status == Status.COMPLETED:
            changes["rerun"] = True
        return changes

    def past_gaps(replayed: list[InboxMessage]) -> None:
        using = inbox_settings.database
        for row in replayed:
            if (
                row.sequence is not None
                and row.last_error.startswith(gaps.GAP_PREFIX)
                and ordering.applies(row.consumer, row.key)
            ):
                gaps.jump_gap(row.pk, row.consumer, row.key, row.sequence, using)

    plain, versions = rerun.split(rows)
    result = _act("replay", plain, statuses, decide, change, options, after=past_gaps)
    if versions.exists():
        rerun.rerun_versions(versions, refusal, options, result)
    return result


def park(rows: QuerySet[InboxMessage], **options: Unpack[ActionOptions]) -> ActionResult:
    """Set ``received``, ``failed`` and ``dead`` rows aside as ``parked``: no worker takes them
    until they are replayed. A row being processed (``in_progress``) cannot be parked."""

    def change(now: datetime, status: str) -> dict[str, Any]:
        return {"status": Status.PARKED, "next_attempt_at": None}

    return _act("park", rows, PARKABLE, None, change, options)


def retry_now(rows: QuerySet[InboxMessage], **options: Unpack[ActionOptions]) -> ActionResult:
    """Make ``failed`` rows due now instead of after their backoff; attempts are kept."""

    def change(now: datetime, status: str) -> dict[str, Any]:
        return {"next_attempt_at": now}

    return _act("retry", rows, RETRYABLE, None, change, options)


def _act(
    action: str,
    rows: QuerySet[InboxMessage],
    statuses: tuple[str, ...],
    decide: Any,
    change: Any,
    options: ActionOptions,
    after: Callable[[list[InboxMessage]], None] | None = None,
) -> ActionResult:
    """Change the rows of ``rows`` in ``statuses`` that ``decide`` accepts with ``change``,
    in batches; ``after`` gets each batch's changed rows once it has committed."""
    actor, reason, via, dry_run, keep = options_of(action, options)
    batch_size = options.get("batch_size", 500)
    using = inbox_settings.database
    result = ActionResult(action=action, dry_run=dry_run)
    other = rows.exclude(status__in=statuses).order_by().values("status").annotate(n=Count("pk"))
    for found in other:  # one GROUP BY for every status the action leaves alone
        status = found["status"]
        result.refused[f"{status} (cannot {action} from {status})"] += found["n"]
    rows_of = family(using)
    fields = ["pk", "consumer", "message_id", "event_type", "status", "attempts", "key"]
    fields += ["sequence", "last_error"]
    last_pk = 0
    while True:
        with transaction.atomic(using=using):
            candidates = (
                rows.using(using)
                .filter(status__in=statuses, pk__gt=last_pk)
                .only(*fields, *([] if rows_of.history_in_sql else ["history"]))
                .order_by("pk")
            )
            if not dry_run:  # a dry run changes nothing, so it locks nothing either
                candidates = candidates.select_for_update(skip_locked=True)
            batch = list(candidates[:batch_size])
            if not batch:
                return result
            last_pk = batch[-1].pk
            now = clock.now()
            accepted = []
            for row in batch:
                refusal = decide(row) if decide is not None else None
                if refusal is None:
                    accepted.append(row)
                else:
                    result.refused[refusal] += 1
            if not dry_run and accepted:
                entry = history.action_entry(
                    action,
                    at=now,
                    actor=actor,
                    reason=reason,
                    previous_status="",
                    attempts=0,
                    via=via,
                )
                accepted = rows_of.change_appending_history(
                    accepted, partial(change, now), entry, now, using
                )
            if not dry_run:
                report(action, accepted, actor, via, reason, using)
        if after is not None and not dry_run and accepted:
            after(accepted)
        for row in accepted:
            result.changed[row.status] += 1
            if keep is None or len(result.rows) < keep:
                result.rows.append((row.pk, row.consumer, row.message_id, row.status))
