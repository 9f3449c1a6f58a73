"""System checks of the Celery settings that make ``@inbox_task`` at least once: run by
``manage.py check --deploy`` (every other command would pay for importing Celery), and said
once in the log by a worker that runs an inbox task without them."""

from __future__ import annotations

import logging
from typing import Any

from django.core.checks import CheckMessage, Warning

from .inbox_task import is_inbox_task

logger = logging.getLogger("django_inbox.celery")

#: Celery's visibility timeout on Redis and SQS when none is set (seconds).
DEFAULT_VISIBILITY_TIMEOUT = 3600.0


def problems(task: Any) -> list[tuple[str, str, str]]:
    """``(id, message, hint)`` of each setting of ``task`` that breaks at-least-once."""
    found = []
    if not task.acks_late:
        found.append(
            (
                "django_inbox.W008",
                f"The inbox task {task.name} is acknowledged before it runs (acks_late is "
                "off): a task whose worker is lost (OOM, deploy, SIGKILL) is never delivered "
                "again, and the inbox never sees it.",
                "Pass acks_late=True to @inbox_task, or set CELERY_TASK_ACKS_LATE = True.",
            )
        )
    elif not task.reject_on_worker_lost:
        found.append(
            (
                "django_inbox.W009",
                f"The inbox task {task.name} is acknowledged as failed when its process dies "
                "(task_reject_on_worker_lost is off): it is not delivered again.",
                "Pass reject_on_worker_lost=True to @inbox_task, or set "
                "CELERY_TASK_REJECT_ON_WORKER_LOST = True. The inbox counts each death, so a "
                "task that kills its worker every time ends dead instead of looping.",
            )
        )
    return found


def module_problems(task: Any) -> list[tuple[str, str, str]]:
    """W011: a task whose module ``inbox_process`` would not import."""
    from django.apps import apps

    from ...conf import inbox_settings

    module = getattr(task.run, "__module__", "")
    found = {
        f"{config.name}.{name}"
        for config in apps.get_app_configs()
        for name in inbox_settings.task_modules
    }
    if module in found:
        return []
    return [
        (
            "django_inbox.W011",
            f"The inbox task {task.name} lives in {module}, which INBOX_TASK_MODULES does not "
            "name: inbox_process and the process_due task in another process would not find "
            "its function, and its failed rows would go dead.",
            "Move it to an installed app's tasks module, add the module's name to "
            "INBOX_TASK_MODULES, or import the module from the app's inbox_handlers module.",
        )
    ]


def broker_problems(app: Any) -> list[tuple[str, str, str]]:
    url = str(app.conf.broker_url or "").split(";")[0]
    if not url.startswith(("redis", "rediss", "sentinel", "sqs")):
        return []
    options = app.conf.broker_transport_options or {}
    timeout = float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT))
    if timeout < DEFAULT_VISIBILITY_TIMEOUT:
        return []
    return [
        (
            "django_inbox.W010",
            f"On {url.split(':')[0]}, a lost worker's inbox tasks come back only after the "
            f"broker's visibility timeout ({timeout:g} s).",
            "Set CELERY_BROKER_TRANSPORT_OPTIONS = {'visibility_timeout': …} a little above "
            "your longest task (a copy delivered while the task still runs finds it in "
            "progress and is acknowledged; nothing runs twice).",
        )
    ]


def check_tasks() -> list[CheckMessage]:
    from celery import current_app

    from ...registry import registry

    registry.load_task_modules()
    tasks = [task for name, task in sorted(current_app.tasks.items()) if is_inbox_task(task)]
    found = [item for task in tasks for item in problems(task) + module_problems(task)]
    if tasks:
        found += broker_problems(current_app)
    return [Warning(message, hint=hint, id=code) for code, message, hint in found]


_warned: set[str] = set()


def warn_once(task: Any) -> None:
    """Log, once per task and process, what :func:`problems` finds (a worker's view)."""
    if task.name in _warned:
        return
    _warned.add(task.name)
    for code, message, hint in problems(task):
        logger.warning("%s %s %s", code, message, hint)
