"""The inbox's operations, in one place: what management commands, Celery tasks and the admin
call. Each function works on the inbox database (``INBOX_DATABASE``) and is safe to run from
several processes at once: rows are claimed or locked with ``SKIP LOCKED`` and changed with
conditional updates, so two runs never process, reclaim, replay or delete a row twice.
"""

from __future__ import annotations

import time

from .actions import ActionResult, command_actor, park, replay, retry_now, select
from .processing import give_back_interrupted
from .purge import PurgeProgress, PurgeResult, expired, purge
from .recovery import ReclaimResult, reclaim, reclaimable
from .stats import ConsumerStats, InboxStats, Problem, collect
from .worker import Worker, WorkerStats


def process_due(
    consumers: list[str] | None = None,
    *,
    max_messages: int | None = 1000,
    max_seconds: float | None = None,
    commit_every: int | None = None,
) -> WorkerStats:
    """Process what is due now (new rows, retries whose backoff passed, dead workers' rows),
    then return: when nothing is due, after ``max_messages`` (``None``: no limit), or once
    ``max_seconds`` have passed (checked between batches)."""
    worker = Worker(consumers, max_messages=max_messages, commit_every=commit_every)
    give_back_interrupted()  # what a run the database walked out on left claimed
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    while worker.run_once():
        if max_messages is not None and worker.stats.handled >= max_messages:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
    return worker.stats


__all__ = [
    "ActionResult",
    "ConsumerStats",
    "InboxStats",
    "Problem",
    "PurgeProgress",
    "PurgeResult",
    "ReclaimResult",
    "WorkerStats",
    "collect",
    "command_actor",
    "expired",
    "give_back_interrupted",
    "park",
    "process_due",
    "purge",
    "reclaim",
    "reclaimable",
    "replay",
    "retry_now",
    "select",
]
