"""``@inbox_task``: Celery tasks run through the inbox, in this process with Celery's own
``Task.apply()`` (a real task request: its id, headers and delivery info). The real worker on
RabbitMQ and Redis, SIGKILLed mid-task, is in tests/system/test_inbox_task_worker.py."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import pytest
from effects.models import Effect
from effects.tasks import retry_later, write_effect

from django_inbox import InvalidMessageId, InvalidPayload, services
from django_inbox.contrib.celery import inbox_task, is_inbox_task
from django_inbox.models import InboxMessage
from tests.conftest import ROOT
from tests.effects import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


def run(
    task: Any, *args: Any, key: str | None = None, task_id: str | None = None, **kwargs: Any
) -> Any:
    headers = {"idempotency_key": key} if key else None
    result = task.apply(args, kwargs, headers=headers, task_id=task_id, throw=True)
    return result.get()


def test_a_key_sent_twice_runs_once_and_the_first_run_returns_the_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="django_inbox.celery")
    first = run(write_effect, "order-42", key="order-42")
    again = run(write_effect, "order-42", key="order-42")

    assert first == {"key": "order-42", "attempt": 1}
    assert again is None
    assert "a duplicate, its effects were applied before" in caplog.text
    assert effect_counts("tasks") == {"order-42": 1}
    row = InboxMessage.objects.get()
    assert (row.consumer, row.message_id, row.event_type, row.status) == (
        "tasks",
        "order-42",
        "effects.tasks.write_effect",
        Status.COMPLETED,
    )
    assert row.payload == {"args": ["order-42"], "kwargs": {}}
    assert row.source == "celery:effects.tasks.write_effect"
    assert set(row.headers) == {"celery_task_id", "celery_task"}


def test_without_a_key_the_task_id_is_the_message_id() -> None:
    """A redelivered task keeps its id: the second run is a duplicate. Two sends without a key
    are two tasks, each run once."""
    assert run(write_effect, "a", task_id="task-1") == {"key": "a", "attempt": 1}
    assert run(write_effect, "a", task_id="task-1") is None
    assert run(write_effect, "a", task_id="task-2") == {"key": "a", "attempt": 1}
    assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == ["task-1", "task-2"]
    assert Effect.objects.filter(consumer="tasks").count() == 2


def test_arguments_that_are_not_json_are_refused_when_sent() -> None:
    """Said by ``delay()`` in the caller, before anything reaches the broker."""
    with pytest.raises(InvalidPayload, match=r"the arguments of effects\.tasks\.write_effect"):
        write_effect.delay(object())
    with pytest.raises(InvalidPayload, match="NaN"):
        write_effect.apply_async(("k",), {"options": {"x": float("nan")}})
    with pytest.raises(InvalidMessageId, match="255"):
        write_effect.apply_async(("k",), headers={"idempotency_key": "x" * 300})
    assert not InboxMessage.objects.exists()


def test_a_failure_is_recorded_and_retried_by_the_inbox_not_by_celery() -> None:
    """The task succeeds (returns None) once its failure is recorded; ``process_due`` retries
    the row with the inbox's backoff; the effect is applied once, by the run that committed."""
    assert run(write_effect, "flaky", key="flaky", options={"fail_times": 2}) is None
    row = InboxMessage.objects.get()
    assert (row.status, row.attempts) == (Status.FAILED, 1)

    import time

    deadline = time.monotonic() + 30
    while row.status != Status.COMPLETED and time.monotonic() < deadline:
        services.process_due(["tasks"], max_messages=10)
        row.refresh_from_db()
        time.sleep(0.05)
    assert (row.status, row.attempts) == (Status.COMPLETED, 3)
    assert list(Effect.objects.filter(consumer="tasks").values_list("attempt", flat=True)) == [3]


@pytest.mark.parametrize(
    ("options", "status"),
    [({"reject": "bad order"}, Status.DEAD), ({"park": "ask finance"}, Status.PARKED)],
)
def test_reject_and_park_inside_a_task(options: dict[str, str], status: str) -> None:
    assert run(write_effect, "k", key="k", options=options) is None
    row = InboxMessage.objects.get()
    assert row.status == status
    assert not Effect.objects.exists()


def test_retry_inside_a_task_leaves_the_row_failed_for_later() -> None:
    assert run(retry_later, "k", key="later") is None
    row = InboxMessage.objects.get()
    assert (row.status, row.event_type) == (Status.FAILED, "effects.retry_later")
    assert "not yet" in row.last_error


def test_task_modules_are_loaded_when_a_handler_is_missing_not_at_startup() -> None:
    """``INBOX_TASK_MODULES`` (``tasks``) of installed apps are imported the first time a
    handler is missing or the consumers are listed (``inbox_process`` finds the handlers of
    task rows without Celery's app), never by ``django.setup()``: a web process or a consumer
    does not pay for Celery."""
    code = (
        "import sys, django; django.setup(); "
        "from django_inbox.registry import registry; "
        "before = 'celery' in sys.modules; "
        "handler = registry.get('tasks', 'effects.tasks.write_effect'); "
        "print(before, handler.name, 'celery' in sys.modules, 'tasks' in registry.consumers())"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
        "INBOX_TEST_CELERY_BEAT": "0",  # django-celery-beat imports Celery itself
    }
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT / "testproject",
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["False", "effects.tasks.write_effect", "True", "True"]
    assert is_inbox_task(write_effect) and not is_inbox_task(object())


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"bind": True}, "bind="),
        ({"autoretry_for": (Exception,)}, "autoretry_for="),
        ({"max_retries": 3}, "max_retries="),
        ({"base": object}, "base="),
    ],
)
def test_options_that_would_break_the_promise_are_refused(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(TypeError, match=says):
        inbox_task(consumer="tasks", **options)


def test_async_functions_are_refused_with_the_reason() -> None:
    async def notify(order_id: int) -> None: ...

    with pytest.raises(TypeError, match="runs a task's function synchronously"):
        inbox_task(consumer="tasks")(notify)


def test_a_chord_header_refuses_an_inbox_task() -> None:
    """A duplicate returns None, which a chord's callback would take as the member's result."""
    from celery import chord
    from testproject.celery import app  # a result backend (Redis), which chords need

    with pytest.raises(TypeError, match=r"in a chord.s header"):
        chord([write_effect.s("a"), write_effect.s("b")], app=app)(write_effect.s())
    assert not InboxMessage.objects.exists()


def test_check_deploy_names_the_settings_that_lose_tasks() -> None:
    """W008 (acks_late off), W009 (reject_on_worker_lost off), W010 (a Redis broker's default
    visibility timeout): ``check --deploy`` only, for every inbox task Celery knows."""
    from celery import current_app

    from django_inbox.contrib.celery.checks import check_tasks

    @inbox_task(consumer="tasks", name="tests.early_ack")
    def early_ack() -> None: ...

    @inbox_task(consumer="tasks", name="tests.lost_on_death", acks_late=True)
    def lost_on_death() -> None: ...

    try:
        found = {(m.id, m.msg.split()[3]) for m in check_tasks()}
        assert ("django_inbox.W008", "tests.early_ack") in found
        assert ("django_inbox.W009", "tests.lost_on_death") in found
        assert not any(name == "effects.tasks.write_effect" for _, name in found)
        # Defined here, in a test module: inbox_process would not import it.
        assert ("django_inbox.W011", "tests.early_ack") in found
        saved = current_app.conf.broker_url
        current_app.conf.broker_url = "redis://127.0.0.1:6379/5"
        try:
            ids = {m.id for m in check_tasks()}
        finally:
            current_app.conf.broker_url = saved
        assert "django_inbox.W010" in ids
    finally:
        from django_inbox.registry import registry

        for name in ("tests.early_ack", "tests.lost_on_death"):
            current_app.tasks.pop(name, None)
            registry.unregister("tasks", name)


def test_a_forced_rerun_of_a_task_row_runs_the_function_again_as_a_rerun() -> None:
    """Task rows are ordinary rows: an operator's forced re-run of a completed one runs the
    function again, marked a re-run (its ``@side_effect`` calls follow the consumer's
    ``side_effects_on_rerun``, as for any message)."""
    from django_inbox import current_message

    assert run(write_effect, "again", key="again") == {"key": "again", "attempt": 1}
    row = InboxMessage.objects.get()
    done = services.replay(services.select(pks=[row.pk]), force=True, actor="operator (test)")
    assert sum(done.changed.values()) == 1
    services.process_due(["tasks"], max_messages=10)
    row.refresh_from_db()
    assert (row.status, row.is_rerun) == (Status.COMPLETED, True)
    assert effect_counts("tasks") == {"again": 2}, "a re-run repeats the task, by request"
    assert current_message() is None, "outside a handler there is no message"


def test_a_redelivered_task_is_ignored_so_its_first_result_and_callbacks_stand() -> None:
    """In a worker (not eager), the same task id again returns nothing: Celery's ``Ignore``
    stores no result over the first run's and sends no callback twice."""
    from celery.exceptions import Ignore

    def deliver_as_worker(task_id: str) -> Any:
        write_effect.push_request(id=task_id, is_eager=False, headers=None, delivery_info={})
        try:
            return write_effect("redelivered")
        finally:
            write_effect.pop_request()

    assert deliver_as_worker("task-r") == {"key": "redelivered", "attempt": 1}
    with pytest.raises(Ignore):
        deliver_as_worker("task-r")
    assert effect_counts("tasks") == {"redelivered": 1}


def test_a_key_with_a_callback_is_refused_when_sent() -> None:
    """A second send with the key returns None, which a ``link=`` callback or the next step
    of a chain would get."""
    with pytest.raises(TypeError, match="callback"):
        write_effect.apply_async(
            ("k",), headers={"idempotency_key": "k"}, link=write_effect.s("next")
        )
    assert not InboxMessage.objects.exists()
