"""The inbox's beat schedule as `django-celery-beat`_ ``PeriodicTask`` rows (extra
``celery-beat``), for a beat run with its ``DatabaseScheduler``.

.. code-block:: python

    # once per deployment (a data migration, a deploy step, or a shell):
    from django_inbox.contrib.celery.beat import register_periodic_tasks

    register_periodic_tasks(process_every=10, purge_every=crontab(hour=3, minute=17))

It writes one ``PeriodicTask`` per entry of :func:`~.schedule.beat_schedule` (same names,
tasks, arguments, queue and expiry), with an ``IntervalSchedule``, ``CrontabSchedule`` or
``SolarSchedule`` as the entry's schedule is. Running it again updates them in place; a task an
operator disabled stays disabled; an entry now left out (``stats_every=None``) is disabled, and
enabled again once it is back.

.. _django-celery-beat: https://pypi.org/project/django-celery-beat/
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

from django.db import transaction

from .schedule import FALLBACK_EXPIRES, beat_schedule, period_seconds

#: The description of a task this module disabled (its entry left out), so that registering
#: it again enables it, where a task an operator disabled stays disabled.
LEFT_OUT = "disabled by django_inbox: left out of the schedule"


def _schedule_row(every: Any) -> tuple[str, Any]:
    """The django-celery-beat schedule row for a beat entry's schedule, saved."""
    from celery.schedules import crontab, schedule, solar
    from django_celery_beat.models import CrontabSchedule, IntervalSchedule, SolarSchedule

    if isinstance(every, crontab):
        field, row = "crontab", CrontabSchedule.from_schedule(every)
    elif isinstance(every, solar):
        field, row = "solar", SolarSchedule.from_schedule(every)
    else:
        seconds = period_seconds(every)
        if seconds is None:
            raise ValueError(f"django-celery-beat cannot store the schedule {every!r}")
        if seconds == int(seconds):
            field = "interval"
            row = IntervalSchedule.from_schedule(schedule(timedelta(seconds=seconds)))
        else:  # a fraction of a second: kept exact in microseconds
            field = "interval"
            row = IntervalSchedule.objects.get_or_create(
                every=round(seconds * 1_000_000), period=IntervalSchedule.MICROSECONDS
            )[0]
    if row.pk is None:
        row.save()
    return field, row


def register_periodic_tasks(**options: Any) -> list[Any]:
    """Write the entries of ``beat_schedule(**options)`` as ``PeriodicTask`` rows, in one
    transaction; return them."""
    from django_celery_beat.models import PeriodicTask

    entries = beat_schedule(**options)
    tasks = []
    with transaction.atomic():
        for name, entry in entries.items():
            field, row = _schedule_row(entry["schedule"])
            schedules: dict[str, Any] = {"interval": None, "crontab": None, "solar": None}
            schedules[field] = row
            task, _ = PeriodicTask.objects.update_or_create(
                name=name,
                defaults={
                    "task": entry["task"],
                    "kwargs": json.dumps(entry["kwargs"]),
                    "queue": entry["options"].get("queue"),
                    "expire_seconds": max(1, math.ceil(entry["options"]["expires"])),
                    **schedules,
                },
            )
            if not task.enabled and task.description == LEFT_OUT:  # ours, not an operator's
                task.enabled, task.description = True, ""
                task.save()
            tasks.append(task)
        # One by one: django-celery-beat tells beat of a change on each save.
        left_out = PeriodicTask.objects.filter(
            name__in=set(FALLBACK_EXPIRES) - set(entries), enabled=True
        )
        for task in left_out:
            task.enabled, task.description = False, LEFT_OUT
            task.save()
    return tasks
