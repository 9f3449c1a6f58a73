"""The test project's Celery app: ``celery -A testproject.celery worker`` / ``beat``.

Broker and result backend come from ``CELERY_BROKER_URL`` / ``CELERY_RESULT_BACKEND``
(Redis by default); the beat schedule is the inbox's, see ``CELERY_BEAT_SCHEDULE`` in settings.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")

app = Celery("testproject")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["django_inbox.contrib.celery"])
