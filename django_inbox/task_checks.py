"""Registers the checks of ``@inbox_task``'s Celery settings (W008 to W011) for
``manage.py check --deploy`` only. They live in :mod:`django_inbox.contrib.celery.checks`,
imported here only when the deploy checks run: importing it imports Celery, which the other
commands and web processes must not pay for."""

from __future__ import annotations

from importlib.util import find_spec
from typing import Any

from django.core.checks import CheckMessage, Tags, register


@register(Tags.compatibility, deploy=True)
def check_inbox_tasks(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if find_spec("celery") is None:
        return []
    from .contrib.celery.checks import check_tasks

    return check_tasks()
