"""A beat schedule for the inbox's upkeep tasks, to paste or import.

.. code-block:: python

    # mysite/celery.py, where the Celery app is made (not settings.py: every manage.py
    # command reads the settings, and this function imports Celery)
    from django_inbox.contrib.celery.schedule import beat_schedule

    app.conf.beat_schedule = {**beat_schedule()}

Each entry expires after its own period: if workers are down, beat's messages do not pile up
and run in a burst when they come back; the next run does the work of the missed ones.
"""

from __future__ import annotations

import numbers
from datetime import timedelta
from typing import Any

#: A message expires after its entry's period, but at most after this many seconds.
MAX_EXPIRES = {"inbox-purge": 3600.0}
#: Seconds a message lives when its schedule has no fixed period (``crontab``, ``solar``).
FALLBACK_EXPIRES = {
    "inbox-process-due": 60.0,
    "inbox-reclaim": 60.0,
    "inbox-purge": 3600.0,
    "inbox-stats": 60.0,
}


def period_seconds(every: Any) -> float | None:
    """The period of a schedule in seconds: seconds, a ``timedelta`` or a Celery ``schedule``;
    ``None`` for schedules without a fixed period (``crontab``, ``solar``)."""
    if isinstance(every, timedelta):
        return every.total_seconds()
    if isinstance(every, numbers.Real):
        return float(every)
    run_every = getattr(every, "run_every", None)
    if isinstance(run_every, timedelta):
        return run_every.total_seconds()
    return None


def beat_schedule(
    *,
    process_every: Any = 10.0,
    reclaim_every: Any = 60.0,
    purge_every: Any = None,
    stats_every: Any = None,
    queue: str | None = None,
    max_messages: int = 1000,
) -> dict[str, dict[str, Any]]:
    """Entries for ``beat_schedule``: process due rows, reclaim, purge (daily at 03:17 by
    default), and optionally log stats. Each period is seconds, a ``timedelta`` or any Celery
    schedule; ``None`` leaves a task out. ``queue`` routes all of them to one queue.

    Each message expires after its entry's period, in seconds as Celery needs (``purge``: at
    most an hour), or after :data:`FALLBACK_EXPIRES` for schedules without a fixed period.
    """
    from celery.schedules import crontab

    if purge_every is None:
        purge_every = crontab(hour=3, minute=17)
    entries: dict[str, dict[str, Any]] = {}

    def add(name: str, task: str, every: Any, kwargs: dict[str, Any]) -> None:
        if every is None:
            return
        expires = period_seconds(every) or FALLBACK_EXPIRES[name]
        options: dict[str, Any] = {"expires": min(expires, MAX_EXPIRES.get(name, expires))}
        if queue:
            options["queue"] = queue
        entries[name] = {"task": task, "schedule": every, "kwargs": kwargs, "options": options}

    if process_every is not None:
        period = period_seconds(process_every) or FALLBACK_EXPIRES["inbox-process-due"]
        add(
            "inbox-process-due",
            "django_inbox.process_due",
            process_every,
            # Stop about when the next run is due, so runs rarely overlap (they may, safely).
            {"max_messages": max_messages, "max_seconds": max(period, 1.0)},
        )
    add("inbox-reclaim", "django_inbox.reclaim", reclaim_every, {})
    add("inbox-purge", "django_inbox.purge", purge_every, {})
    add("inbox-stats", "django_inbox.stats", stats_every, {})
    return entries
