"""The Celery beat schedule the inbox builds (its tasks running in a real worker are in
``tests/system/test_celery.py``)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from datetime import timedelta

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from django.conf import settings

from django_inbox.contrib.celery.schedule import beat_schedule
from tests.conftest import ROOT

CELERY_FILE = ROOT / "testproject" / "testproject" / "celery.py"


def test_beat_schedule_entries() -> None:
    entries = beat_schedule(
        process_every=5.0, reclaim_every=30.0, purge_every=3600.0, stats_every=60.0, queue="ops"
    )
    assert {name: entry["task"] for name, entry in entries.items()} == {
        "inbox-process-due": "django_inbox.process_due",
        "inbox-reclaim": "django_inbox.reclaim",
        "inbox-purge": "django_inbox.purge",
        "inbox-stats": "django_inbox.stats",
    }
    assert {name: entry["schedule"] for name, entry in entries.items()} == {
        "inbox-process-due": 5.0,
        "inbox-reclaim": 30.0,
        "inbox-purge": 3600.0,
        "inbox-stats": 60.0,
    }
    # Each entry expires after its period, so missed runs do not pile up while workers are down.
    assert {name: entry["options"] for name, entry in entries.items()} == {
        "inbox-process-due": {"expires": 5.0, "queue": "ops"},
        "inbox-reclaim": {"expires": 30.0, "queue": "ops"},
        "inbox-purge": {"expires": 3600.0, "queue": "ops"},
        "inbox-stats": {"expires": 60.0, "queue": "ops"},
    }
    # A run stops about when the next one is due.
    assert entries["inbox-process-due"]["kwargs"] == {"max_messages": 1000, "max_seconds": 5.0}

    defaults = beat_schedule()
    assert set(defaults) == {"inbox-process-due", "inbox-reclaim", "inbox-purge"}
    assert defaults["inbox-purge"]["schedule"] == crontab(hour=3, minute=17)
    assert all("queue" not in entry["options"] for entry in defaults.values())

    only_process = beat_schedule(reclaim_every=None, purge_every=None, process_every=0.5)
    assert set(only_process) == {"inbox-process-due", "inbox-purge"}, "purge None is the default"
    assert only_process["inbox-process-due"]["kwargs"]["max_seconds"] == 1.0
    assert "inbox-process-due" not in beat_schedule(process_every=None)
    assert "inbox-stats" not in beat_schedule(stats_every=None)


def test_beat_schedule_accepts_timedeltas_and_celery_schedules() -> None:
    # Celery needs ``expires`` in seconds (or a datetime): a timedelta there fails when beat
    # sends the task, so every period becomes seconds.
    entries = beat_schedule(
        process_every=timedelta(seconds=20),
        reclaim_every=schedule(timedelta(minutes=2)),
        purge_every=86400,
        stats_every=crontab(minute="*/5"),
    )
    assert {name: entry["options"]["expires"] for name, entry in entries.items()} == {
        "inbox-process-due": 20.0,
        "inbox-reclaim": 120.0,
        "inbox-purge": 3600.0,  # at most an hour
        "inbox-stats": 60.0,  # no fixed period: the fallback
    }
    for entry in entries.values():
        assert type(entry["options"]["expires"]) is float
    assert entries["inbox-process-due"]["schedule"] == timedelta(seconds=20)
    assert entries["inbox-process-due"]["kwargs"]["max_seconds"] == 20.0
    assert beat_schedule(purge_every=600)["inbox-purge"]["options"]["expires"] == 600.0
    cron = beat_schedule(process_every=crontab())["inbox-process-due"]
    assert cron["options"]["expires"] == 60.0
    assert cron["kwargs"]["max_seconds"] == 60.0

    # What beat does with each entry: publish it with its options (an in-memory broker).
    memory = Celery("schedule-check", broker="memory://", set_as_current=False)
    with memory.connection_for_write() as connection:
        for name, entry in entries.items():
            sent = memory.send_task(
                entry["task"], kwargs=entry["kwargs"], connection=connection, **entry["options"]
            )
            assert sent.id, name
            message = connection.default_channel.basic_get("celery")
            assert message.headers["task"] == entry["task"]
            assert message.headers["expires"], f"{name} is sent with an expiry"


def test_the_celery_app_builds_the_beat_schedule_from_beat_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from testproject.celery import app

    assert app.conf.beat_schedule == beat_schedule(
        process_every=float(os.environ.get("INBOX_BEAT_PROCESS_EVERY", 10.0)),
        reclaim_every=float(os.environ.get("INBOX_BEAT_RECLAIM_EVERY", 60.0)),
    )
    assert app.conf.task_default_queue == settings.CELERY_TASK_DEFAULT_QUEUE
    app.loader.import_default_modules()  # what the worker does: autodiscovers the tasks
    for name in ("process_due", "reclaim", "purge", "stats"):
        assert f"django_inbox.{name}" in app.tasks

    # The periods come from the environment, as the process tests set them.
    monkeypatch.setenv("INBOX_BEAT_PROCESS_EVERY", "0.5")
    monkeypatch.setenv("INBOX_BEAT_RECLAIM_EVERY", "2")
    fresh = runpy.run_path(str(CELERY_FILE))["app"]
    assert fresh.conf.beat_schedule == beat_schedule(process_every=0.5, reclaim_every=2.0)
    assert fresh.conf.beat_schedule["inbox-process-due"]["options"] == {"expires": 0.5}


def test_settings_do_not_import_celery() -> None:
    """Every manage.py command reads the settings; the consumers must not pay for Celery."""
    code = (
        "import sys, django; django.setup(); "
        "from django_inbox.management.commands import inbox_consume, inbox_process; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'celery'}))"
    )
    # django-celery-beat, in the test project's apps when installed, imports Celery itself.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "INBOX_TEST_CELERY_BEAT": "0",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT / "testproject",
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
