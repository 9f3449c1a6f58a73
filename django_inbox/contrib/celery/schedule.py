"""A beat schedule for the inbox's upkeep tasks, to paste or import.

.. code-block:: python

    # settings.py (Celery reads CELERY_* settings with namespace="CELERY")
    from django_inbox.contrib.celery.schedule import beat_schedule

    CELERY_BEAT_SCHEDULE = {**beat_schedule()}

Each entry expires after its own period: if workers are down, beat's messages do not pile up
and run in a burst when they come back; the next run does the work of the missed ones.
"""

from __future__ import annotations

from typing import Any


def beat_schedule(
    *,
    process_every: float | None = 10.0,
    reclaim_every: float | None = 60.0,
    purge_every: Any = None,
    stats_every: float | None = None,
    queue: str | None = None,
    max_messages: int = 1000,
) -> dict[str, dict[str, Any]]:
    """Entries for ``beat_schedule``: process due rows, reclaim, purge (daily at 03:17 by
    default; any Celery schedule or seconds), and optionally log stats. ``None`` leaves a task
    out. ``queue`` routes all of them to one queue."""
    from celery.schedules import crontab

    if purge_every is None:
        purge_every = crontab(hour=3, minute=17)
    entries: dict[str, dict[str, Any]] = {}

    def add(name: str, task: str, every: Any, kwargs: dict[str, Any], expires: float) -> None:
        if every is None:
            return
        options: dict[str, Any] = {"expires": expires}
        if queue:
            options["queue"] = queue
        entries[name] = {"task": task, "schedule": every, "kwargs": kwargs, "options": options}

    if process_every is not None:
        add(
            "inbox-process-due",
            "django_inbox.process_due",
            process_every,
            # Stop about when the next run is due, so runs rarely overlap (they may, safely).
            {"max_messages": max_messages, "max_seconds": max(float(process_every), 1.0)},
            process_every,
        )
    add("inbox-reclaim", "django_inbox.reclaim", reclaim_every, {}, reclaim_every or 60.0)
    add("inbox-purge", "django_inbox.purge", purge_every, {}, 3600.0)
    add("inbox-stats", "django_inbox.stats", stats_every, {}, stats_every or 60.0)
    return entries
