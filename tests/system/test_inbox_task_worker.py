"""``@inbox_task`` with real Celery workers (prefork, ``acks_late``, ``reject_on_worker_lost``)
on RabbitMQ and on Redis, SIGKILLed mid-task; then ``inbox_process`` (no Celery) and the
operator's replay finishing what the workers left. Every test counts effects: lost 0,
doubled 0."""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery", reason="inbox tasks need celery (the celery extra)")

from effects.models import Effect
from effects.tasks import write_effect
from kombu import Connection

from django_inbox import services
from django_inbox.models import InboxMessage
from tests.brokers import RABBITMQ
from tests.effects import effect_counts
from tests.system.test_celery import (  # noqa: F401 (fixtures)
    REDIS_URL,
    CeleryProcesses,
    _forget_connections,
    celery_redis,
    wait_until,
)

pytestmark = [pytest.mark.server_db, pytest.mark.slow]
Status = InboxMessage.Status


def lost_and_doubled(keys: set[str]) -> tuple[int, int]:
    counts = effect_counts("tasks")
    return sum(1 for k in keys if counts.get(k, 0) == 0), sum(1 for n in counts.values() if n > 1)


@pytest.fixture(params=["rabbitmq", "redis"])
def broker(request: pytest.FixtureRequest, celery_redis: str) -> str:  # noqa: F811
    return RABBITMQ if request.param == "rabbitmq" else celery_redis


@pytest.fixture
def tasks_app(broker: str) -> Iterator[Any]:
    """The test project's Celery app, sending to ``broker``."""
    from testproject.celery import app

    saved = {key: app.conf[key] for key in ("broker_url", "result_backend")}
    app.conf.update(broker_url=broker, result_backend=REDIS_URL)
    _forget_connections(app)
    yield app
    app.conf.update(saved)
    _forget_connections(app)


@pytest.fixture
def workers(
    subprocess_env: dict[str, str], broker: str, tmp_path: Path
) -> Iterator[CeleryProcesses]:
    queue = f"inbox-tasks-{uuid.uuid4().hex[:10]}"
    env = {
        **subprocess_env,
        "CELERY_BROKER_URL": broker,
        "CELERY_RESULT_BACKEND": REDIS_URL,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        # Redis gives a killed worker's unacknowledged tasks back after this (seconds).
        "CELERY_VISIBILITY_TIMEOUT": "4",
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        # More attempts than kills: a task caught in every kill would otherwise end dead.
        "TASKS_MAX_ATTEMPTS": "20",
    }
    procs = CeleryProcesses(env=env, queue=queue, logs=tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()
        if broker.startswith("amqp"):
            with Connection(broker) as conn:
                conn.default_channel.queue_delete(queue)


def kill_group(workers: CeleryProcesses, proc: Any) -> None:
    """SIGKILL a worker and its prefork children: a machine lost mid-task."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    workers.started = [(name, p) for name, p in workers.started if p is not proc]


def test_duplicates_and_killed_workers_apply_each_task_once(
    tasks_app: Any, workers: CeleryProcesses, broker: str
) -> None:
    """Tasks with 30% sent twice under the same ``idempotency_key``, while the worker is
    SIGKILLed mid-task and restarted (10 times on RabbitMQ, 4 on Redis, whose redeliveries
    wait for the visibility timeout): each key's effect once, every row completed.

    The beat runs, as in a deployment: a redelivery that finds its row still held by the
    killed process's lease (a new worker up within the 2 s lease) is answered ``in_progress``
    and acknowledged, and the ``process_due`` task finishes that row after the lease. Without
    it the test depended on every new worker starting slower than the lease (it failed once
    in three runs with two test lanes sharing the machine)."""
    workers.env["INBOX_BEAT_PROCESS_EVERY"] = "0.5"
    workers.env["INBOX_BEAT_RECLAIM_EVERY"] = "1.0"
    rng = random.Random(31)
    rabbit = broker.startswith("amqp")
    count, kills = (2000, 10) if rabbit else (400, 4)
    keys = [f"order-{n:04d}" for n in range(count)]
    sends = [key for key in keys for _ in range(2 if rng.random() < 0.3 else 1)]
    rng.shuffle(sends)
    for key in sends:
        write_effect.apply_async(
            (key,),
            {"options": {"sleep": 0.005}},
            headers={"idempotency_key": key},
            queue=workers.queue,
            ignore_result=True,
        )

    worker = workers.worker(concurrency=3)
    workers.beat("beat")
    killed = 0
    while killed < kills:
        time.sleep(rng.uniform(1.0, 2.0))
        if InboxMessage.objects.filter(status=Status.COMPLETED).count() >= count:
            break
        kill_group(workers, worker)
        killed += 1
        worker = workers.worker(concurrency=3)

    def done() -> bool:
        return not InboxMessage.objects.exclude(status=Status.COMPLETED).exists() and (
            InboxMessage.objects.count() == count
        )

    wait_until(done, workers, timeout=300)
    lost, doubled = lost_and_doubled(set(keys))
    retried = InboxMessage.objects.filter(attempts__gt=1).count()
    print(
        f"inbox tasks on {broker.split(':')[0]}: {len(sends)} sends of {count} keys, "
        f"{killed} SIGKILLs, {retried} rows run more than once, lost={lost} doubled={doubled}"
    )
    assert killed == kills, "the workers finished before every kill: make the run longer"
    assert (lost, doubled) == (0, 0)
    assert Effect.objects.filter(consumer="tasks").count() == count


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_task_that_kills_its_worker_every_time_ends_dead(
    tasks_app: Any, workers: CeleryProcesses
) -> None:
    """``reject_on_worker_lost`` gives the task back when its process dies; the redelivery
    counts the lost attempt and runs it again. Once the row is stored, a redelivery that finds
    it held by the dead process's lease answers ``in_progress`` and is acknowledged: the row
    is the inbox's now, and the ``process_due`` beat task retries it after the lease, counting
    each death, so after ``max_attempts`` (3 here) it is dead, not a loop."""
    workers.env["TASKS_MAX_ATTEMPTS"] = "3"
    workers.env["INBOX_BEAT_PROCESS_EVERY"] = "0.5"
    workers.env["INBOX_BEAT_RECLAIM_EVERY"] = "1.0"
    write_effect.apply_async(
        ("poison",), {"options": {"kill": "always"}}, queue=workers.queue, ignore_result=True
    )
    write_effect.apply_async(("healthy",), queue=workers.queue, ignore_result=True)
    workers.worker(concurrency=1)
    workers.beat("beat")

    def settled() -> bool:
        return set(InboxMessage.objects.values_list("status", flat=True)) == {
            Status.DEAD,
            Status.COMPLETED,
        }

    wait_until(settled, workers, timeout=120)
    (poison,) = [row for row in InboxMessage.objects.all() if row.payload["args"] == ["poison"]]
    assert (poison.status, poison.attempts) == (Status.DEAD, 3)
    assert "giving up after 3 attempts" in poison.last_error
    assert effect_counts("tasks") == {"healthy": 1}
    time.sleep(2)  # no further redelivery runs it again
    assert InboxMessage.objects.get(pk=poison.pk).attempts == 3


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_failures_are_finished_by_inbox_process_and_a_replay(
    tasks_app: Any, workers: CeleryProcesses, manage: Any
) -> None:
    """A task failing twice then succeeding: the worker records the first failure and the
    task succeeds; ``inbox_process`` (no Celery app, the handler found in ``effects.tasks``)
    retries it to completion. A rejected task is dead; the operator's replay (the admin's
    service) and ``inbox_process`` run it again, once."""
    write_effect.apply_async(
        ("flaky",), {"options": {"fail_times": 2}}, headers={"idempotency_key": "flaky"},
        queue=workers.queue,
    )  # fmt: skip
    write_effect.apply_async(
        ("refused",), {"options": {"reject": "bad order"}}, headers={"idempotency_key": "refused"},
        queue=workers.queue,
    )  # fmt: skip
    workers.worker(concurrency=1)
    wait_until(lambda: InboxMessage.objects.count() == 2, workers)
    wait_until(
        lambda: (
            set(InboxMessage.objects.values_list("status", flat=True))
            == {Status.FAILED, Status.DEAD}
        ),
        workers,
    )
    workers.stop_all()

    done = manage("inbox_process", "--consumer", "tasks", "--until-idle", "2")
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err[-3000:]
    flaky = InboxMessage.objects.get(message_id="flaky")
    assert (flaky.status, flaky.attempts) == (Status.COMPLETED, 3)

    refused = InboxMessage.objects.get(message_id="refused")
    assert refused.status == Status.DEAD and "bad order" in refused.last_error
    # The operator fixed the cause: the row now runs without the reject.
    InboxMessage.objects.filter(pk=refused.pk).update(payload={"args": ["refused"], "kwargs": {}})
    replayed = services.replay(services.select(pks=[refused.pk]), actor="operator (test)")
    assert sum(replayed.changed.values()) == 1
    again = manage("inbox_process", "--consumer", "tasks", "--until-idle", "2")
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0, err[-3000:]
    assert InboxMessage.objects.get(pk=refused.pk).status == Status.COMPLETED
    assert effect_counts("tasks") == {"flaky": 1, "refused": 1}


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_a_group_of_inbox_tasks_runs_each_member_once(
    tasks_app: Any, workers: CeleryProcesses
) -> None:
    """A group works: each member is its own task (its own id or key); the group sent again
    with the same keys runs nothing twice."""
    from celery import group

    members = [
        write_effect.s(f"g-{n}").set(headers={"idempotency_key": f"g-{n}"}, queue=workers.queue)
        for n in range(10)
    ]
    workers.worker(concurrency=2)
    first = group(members).apply_async()
    assert [r["key"] for r in first.get(timeout=60)] == [f"g-{n}" for n in range(10)]
    second = group(members).apply_async()
    assert second.get(timeout=60) == [None] * 10
    assert effect_counts("tasks") == {f"g-{n}": 1 for n in range(10)}
    # One key given to the whole group: each member keeps its own message (key#index).
    batch = [write_effect.s(f"b-{n}").set(queue=workers.queue) for n in range(3)]
    group(batch).apply_async(headers={"idempotency_key": "batch-7"}).get(timeout=60)
    group(batch).apply_async(headers={"idempotency_key": "batch-7"}).get(timeout=60)
    rows = InboxMessage.objects.filter(message_id__startswith="batch-7")
    assert sorted(rows.values_list("message_id", flat=True)) == [f"batch-7#{n}" for n in range(3)]
    assert {f"b-{n}" for n in range(3)} <= set(effect_counts("tasks"))
    assert all(effect_counts("tasks")[f"b-{n}"] == 1 for n in range(3))


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
def test_the_admin_shows_a_dead_task_and_its_replay_runs_in_the_celery_worker(
    tasks_app: Any, workers: CeleryProcesses
) -> None:
    """A rejected task is dead; the admin lists it under its consumer and event type, an
    operator replays it through the confirmation page, and the Celery worker's ``process_due``
    (beat) runs it, once."""
    from tests.unit.test_admin import CHANGELIST, as_post, form_with, html, login, make_user

    write_effect.apply_async(
        ("refund-7",), {"options": {"reject": "card expired"}},
        headers={"idempotency_key": "refund-7"}, queue=workers.queue,
    )  # fmt: skip
    workers.env.update(INBOX_BEAT_PROCESS_EVERY="0.5", INBOX_BEAT_RECLAIM_EVERY="1.0")
    workers.worker(concurrency=1)
    wait_until(lambda: InboxMessage.objects.filter(status=Status.DEAD).exists(), workers)
    row = InboxMessage.objects.get()
    assert "card expired" in row.last_error

    client = login(make_user("superuser"))
    listed = html(client.get(CHANGELIST, {"consumer": "tasks"}))
    assert "refund-7" in listed and "effects.tasks.write_effect" in listed
    # The operator fixed the cause (here: the argument that made it reject).
    InboxMessage.objects.filter(pk=row.pk).update(payload={"args": ["refund-7"], "kwargs": {}})
    first = client.post(
        CHANGELIST, {"action": "replay_messages", "_selected_action": [row.pk], "index": 0}
    )
    form = form_with(html(first), "confirm", "yes")
    done = client.post(CHANGELIST, as_post(form, reason="card updated, OPS-7"))
    assert done.status_code == 302

    workers.beat("beat")
    wait_until(lambda: InboxMessage.objects.get(pk=row.pk).status == Status.COMPLETED, workers)
    assert effect_counts("tasks") == {"refund-7": 1}
