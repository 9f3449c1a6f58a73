"""The inbox with two packages of the Django and Celery ecosystem, each the real package:
django-health-check's view runs :class:`django_inbox.contrib.health_check.Inbox`, and
django-celery-beat's ``DatabaseScheduler`` reads the rows
:func:`django_inbox.contrib.celery.beat.register_periodic_tasks` writes."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from celery import Celery
from celery.schedules import crontab
from django.test import RequestFactory
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler
from health_check.views import HealthCheckView

from django_inbox.contrib.celery.beat import register_periodic_tasks
from django_inbox.contrib.health_check import Inbox
from django_inbox.models import InboxMessage

Status = InboxMessage.Status


def _health(*checks: Any) -> tuple[int, dict[str, Any]]:
    view = HealthCheckView.as_view(checks=list(checks))
    response = async_to_sync(view)(RequestFactory().get("/ht/", {"format": "json"}))
    return response.status_code, json.loads(response.content)


def _dead(consumer: str, n: int) -> None:
    for k in range(n):
        InboxMessage.objects.create(
            consumer=consumer, message_id=f"{consumer}-{k}", event_type="effect.write",
            payload={}, status=Status.DEAD, attempts=3, last_error="RuntimeError: down",
        )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_the_health_check_passes_when_healthy_and_names_the_problems_when_not() -> None:
    assert _health("django_inbox.contrib.health_check.Inbox")[0] == 200

    _dead("effects", 2)
    status, body = _health(
        "django_inbox.contrib.health_check.Inbox",
        ("django_inbox.contrib.health_check.Inbox", {"ignore": ("dead",)}),
        ("django_inbox.contrib.health_check.Inbox", {"consumer": "stream"}),
    )

    assert status == 500
    said = {name: text for name, text in body.items()}
    assert any("effects: 2 dead message(s) need an operator" in text for text in said.values()), (
        said
    )
    assert sum(text == "OK" for text in said.values()) == 2, said


def test_the_health_check_refuses_an_unknown_problem_kind() -> None:
    with pytest.raises(ValueError, match="unknown problem kind"):
        Inbox(ignore=("deadd",))


@pytest.mark.django_db
def test_the_beat_schedule_as_periodic_tasks_read_by_the_database_scheduler() -> None:
    tasks = register_periodic_tasks(process_every=10, reclaim_every=timedelta(minutes=1),
                                    stats_every=30, queue="upkeep")  # fmt: skip

    by_name = {task.name: task for task in tasks}
    assert set(by_name) == {"inbox-process-due", "inbox-reclaim", "inbox-purge", "inbox-stats"}
    due = by_name["inbox-process-due"]
    assert (due.task, json.loads(due.kwargs), due.queue, due.expire_seconds) == (
        "django_inbox.process_due", {"max_messages": 1000, "max_seconds": 10.0}, "upkeep", 10,
    )  # fmt: skip
    assert (due.interval.every, due.interval.period) == (10, "seconds")
    assert by_name["inbox-reclaim"].interval.every == 60
    purge = by_name["inbox-purge"]
    purge.crontab.refresh_from_db()
    assert (purge.crontab.minute, purge.crontab.hour, purge.expire_seconds) == ("17", "3", 3600)

    # The scheduler loads a crontab with a fixed hour only within two hours of now: the
    # purge at every hour's minute 17 is loaded whatever the time of the run.
    register_periodic_tasks(
        process_every=10,
        reclaim_every=timedelta(minutes=1),
        stats_every=30,
        queue="upkeep",
        purge_every=crontab(minute=17),
    )
    app = Celery("inbox-test", set_as_current=False)
    app.conf.beat_schedule = {}
    schedule = DatabaseScheduler(app=app, lazy=True).all_as_schedule()
    assert {name: entry.task for name, entry in schedule.items()}.items() >= {
        "inbox-process-due": "django_inbox.process_due",
        "inbox-reclaim": "django_inbox.reclaim",
        "inbox-purge": "django_inbox.purge",
        "inbox-stats": "django_inbox.stats",
    }.items()
    assert schedule["inbox-process-due"].schedule.run_every == timedelta(seconds=10)
    assert schedule["inbox-purge"].schedule == crontab(minute=17)
    assert PeriodicTask.objects.count() == 4  # updated in place


@pytest.mark.django_db
def test_registering_again_updates_in_place_keeps_an_operators_disable_and_drops_left_out() -> None:
    register_periodic_tasks(stats_every=30)
    PeriodicTask.objects.filter(name="inbox-reclaim").update(enabled=False)  # an operator

    register_periodic_tasks(process_every=2.5, stats_every=None)

    rows = {task.name: task for task in PeriodicTask.objects.all()}
    assert len(rows) == 4
    assert rows["inbox-reclaim"].enabled is False
    assert rows["inbox-stats"].enabled is False  # left out now
    due = rows["inbox-process-due"]
    assert (due.interval.every, due.interval.period) == (2_500_000, "microseconds")
    assert (due.enabled, due.expire_seconds) == (True, 3)  # 2.5 s, rounded up

    register_periodic_tasks(stats_every=60)  # back in the schedule: enabled again
    rows = {task.name: task for task in PeriodicTask.objects.all()}
    assert (rows["inbox-stats"].enabled, rows["inbox-reclaim"].enabled) == (True, False)
