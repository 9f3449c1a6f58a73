"""Celery tasks that run the inbox's upkeep: the same service functions as the commands.

Every task is safe to run twice, or several times at once: ``process_due`` claims rows with
``FOR UPDATE SKIP LOCKED`` and completes them fenced on their lease; ``reclaim`` and ``purge``
lock what they change and skip what others hold. So a task that Celery delivers again (a
lost worker with ``acks_late``, a Redis visibility timeout, two beat schedulers) does no harm:
it finds the work already done, or done by the other run.

Load them in your Celery app: ``app.autodiscover_tasks(["django_inbox.contrib.celery"])``.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import shared_task

from ... import services

logger = logging.getLogger("django_inbox")


@shared_task(name="django_inbox.process_due")
def process_due(
    consumers: list[str] | None = None,
    max_messages: int | None = 1000,
    max_seconds: float | None = 50.0,
    commit_every: int | None = None,
) -> dict[str, Any]:
    """Process due rows (new, retries past their backoff, dead workers' rows), then return.

    Bounded by ``max_messages`` and ``max_seconds`` so a run ends before the next one is due;
    returns the outcome counts.
    """
    stats = services.process_due(
        consumers,
        max_messages=max_messages,
        max_seconds=max_seconds,
        commit_every=commit_every,
    )
    return {"handled": stats.handled, "outcomes": dict(stats.outcomes), "released": stats.released}


@shared_task(name="django_inbox.reclaim")
def reclaim(consumer: str | None = None, older_than: float = 0.0) -> dict[str, int]:
    """Recover rows whose worker died (``inbox_reclaim``)."""
    result = services.reclaim(consumer=consumer, older_than=older_than)
    if result.total:
        logger.warning(
            "inbox reclaim: %d failed, %d dead, %d released",
            result.failed,
            result.dead,
            result.released,
        )
    return {"failed": result.failed, "dead": result.dead, "released": result.released}


@shared_task(name="django_inbox.purge")
def purge(
    older_than: float | None = None,
    statuses: list[str] | None = None,
    consumer: str | None = None,
    batch_size: int = 1000,
) -> dict[str, Any]:
    """Delete rows past their retention (``inbox_purge``)."""
    result = services.purge(
        statuses=tuple(statuses) if statuses else None,
        older_than=older_than,
        consumer=consumer,
        batch_size=batch_size,
    )
    logger.info("inbox purge: deleted %s in %.1fs", result.deleted, result.elapsed)
    return {"deleted": result.deleted, "skipped": result.skipped, "elapsed": result.elapsed}


@shared_task(name="django_inbox.stats")
def stats() -> dict[str, Any]:
    """Collect ``inbox_stats`` and log each problem (for alerting on logs)."""
    collected = services.collect()
    for problem in collected.problems:
        logger.error("inbox problem: %s", problem.message)
    return collected.as_dict()


@shared_task(name="django_inbox.outbox_relay")
def outbox_relay(
    broker_url: str | None = None,
    max_messages: int | None = 10_000,
    max_seconds: float = 50.0,
    batch_size: int = 100,
) -> dict[str, Any]:
    """Publish the outbox for at most ``max_seconds`` (or ``max_messages``), then return: for
    teams that run everything under beat. Safe to overlap: relays share the work (``SKIP
    LOCKED``, a key's oldest row only). Needs ``django_inbox.outbox`` installed and an AMQP
    broker (``broker_url`` or ``INBOX_BROKER_URL``)."""
    from ... import companions
    from ...conf import inbox_settings

    outbox = companions.outbox()
    if outbox is None:
        raise ValueError("outbox_relay: django_inbox.outbox is not in INSTALLED_APPS")
    url = broker_url or inbox_settings.broker_url
    if not url:
        raise ValueError("outbox_relay: no broker_url and no INBOX_BROKER_URL")
    done = outbox.relay(
        url, max_messages=max_messages, max_seconds=max_seconds, batch_size=batch_size
    )
    if not done["reached"]:
        logger.warning("outbox_relay task: the broker was never reached; nothing was sent")
    return done
