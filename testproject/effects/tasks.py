"""``@inbox_task`` tasks of the tests (consumer ``tasks``): each writes one ``Effect`` row, and
misbehaves as its arguments ask (the handlers' ``_misbehave`` options: ``kill_file``,
``kill``, ``fail_times``, ``reject``, ``park``…)."""

import os

from django_inbox import Retry, current_message
from django_inbox.contrib.celery import inbox_task

from .inbox_handlers import _misbehave
from .models import Effect


class _Message:
    """What ``_misbehave`` reads of a message."""

    def __init__(self, payload, attempts):
        self.payload = payload
        self.attempts = attempts


@inbox_task(consumer="tasks", acks_late=True, reject_on_worker_lost=True)
def write_effect(key, options=None, attempt=None):
    """One effect per run; ``options`` as the handlers' payload options."""
    attempts = current_message().attempts
    Effect.objects.create(consumer="tasks", message_id=key, attempt=attempts, pid=os.getpid())
    _misbehave(_Message(options or {}, attempts))
    return {"key": key, "attempt": attempts}


@inbox_task(
    consumer="tasks", name="effects.retry_later", acks_late=True, reject_on_worker_lost=True
)
def retry_later(key):
    raise Retry("not yet", delay=0.05)
