"""Celery integration (``pip install django-transactional-inbox[celery]``).

:func:`inbox_task` makes Celery tasks whose database effects happen once; the inbox's upkeep
tasks are in :mod:`django_inbox.contrib.celery.tasks`; a beat schedule in
:mod:`django_inbox.contrib.celery.schedule`.
"""

from .inbox_task import IDEMPOTENCY_HEADER, InboxTask, inbox_task, is_inbox_task

__all__ = ["IDEMPOTENCY_HEADER", "InboxTask", "inbox_task", "is_inbox_task"]
