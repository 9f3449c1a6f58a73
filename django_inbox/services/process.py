"""Running handlers: ``process_due()`` for bounded runs (Celery, a cron job) and the
long-running loops behind ``inbox_process`` and ``inbox_consume``."""

from __future__ import annotations

import time

from ..broker.connection import (
    AckMode,
    BrokerConsumer,
    BrokerMisconfigured,
    BrokerUnreachable,
    ConsumeStats,
)
from ..db.outage import DatabaseMisconfigured
from ..processing.giving_back import give_back_interrupted
from ..processing.worker import Worker, WorkerStats

__all__ = [
    "AckMode",
    "BrokerConsumer",
    "BrokerMisconfigured",
    "BrokerUnreachable",
    "ConsumeStats",
    "DatabaseMisconfigured",
    "Worker",
    "WorkerStats",
    "give_back_interrupted",
    "process_due",
]


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
