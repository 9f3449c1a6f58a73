"""The test project's Celery app: ``celery -A testproject.celery worker`` / ``beat``.

Broker and result backend come from ``CELERY_BROKER_URL`` / ``CELERY_RESULT_BACKEND``
(Redis by default); the beat schedule is the inbox's, built here so that settings (which every
``manage.py`` command reads) do not import Celery. Tests shorten the periods through
``INBOX_BEAT_PROCESS_EVERY`` and ``INBOX_BEAT_RECLAIM_EVERY``.
"""

import os

from celery import Celery

from django_inbox.contrib.celery.schedule import beat_schedule

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()  # every installed app's tasks.py (the @inbox_task ones too)
app.autodiscover_tasks(["django_inbox.contrib.celery"])
app.conf.beat_schedule = beat_schedule(
    process_every=float(os.environ.get("INBOX_BEAT_PROCESS_EVERY", 10.0)),
    reclaim_every=float(os.environ.get("INBOX_BEAT_RECLAIM_EVERY", 60.0)),
)
