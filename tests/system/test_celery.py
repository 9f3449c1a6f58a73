"""The Celery integration, proven with a real worker and real beat schedulers on real Redis.

The worker and beat run as subprocesses (``celery -A testproject.celery worker|beat``) against
the test database and a Redis database only these tests use (``INBOX_TEST_CELERY_REDIS``,
default ``redis://127.0.0.1:6379/11``, flushed at the start of each test), each test on a queue
of its own. Every process test ends by counting committed effects: lost = 0, doubled = 0.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery", reason="the Celery integration needs celery (the celery extra)")

import redis
from django.db import transaction
from django.utils import timezone
from effects.models import Effect

from django_inbox import Outcome, deliver, store
from django_inbox.models import InboxMessage
from tests.conftest import ROOT
from tests.effects import lost_and_doubled

Status = InboxMessage.Status
REDIS_URL = os.environ.get("INBOX_TEST_CELERY_REDIS", "redis://127.0.0.1:6379/11")
PROJECT = ROOT / "testproject"
SETTINGS_FILE = PROJECT / "testproject" / "settings.py"


# --- real processes ---------------------------------------------------------------------------


@dataclass
class CeleryProcesses:
    """Starts ``celery worker`` / ``celery beat`` subprocesses; :meth:`stop_all` ends them."""

    env: dict[str, str]
    queue: str
    logs: Path
    started: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)

    def _start(self, name: str, *args: str, env: dict[str, str] | None = None) -> Any:
        log = (self.logs / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "testproject.celery", *args],
            env={**self.env, **(env or {})},
            cwd=PROJECT,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own process group, so the prefork children can be killed with it.
            start_new_session=True,
        )
        log.close()
        self.started.append((name, proc))
        return proc

    def worker(self, concurrency: int = 3) -> subprocess.Popen[bytes]:
        return self._start(
            "worker",
            "worker",
            "--loglevel=WARNING",
            "--concurrency",
            str(concurrency),
            "--pool",
            "prefork",
            "--without-gossip",
            "--without-mingle",
            "-Q",
            self.queue,
        )

    def beat(self, name: str) -> subprocess.Popen[bytes]:
        schedule = self.logs / f"{name}-schedule"
        return self._start(name, "beat", "--schedule", str(schedule), "--loglevel=WARNING")

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def logs_text(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)}" for name, _ in self.started)

    def assert_running(self) -> None:
        for name, proc in self.started:
            assert proc.poll() is None, f"{name} exited with {proc.returncode}\n{self.log(name)}"

    def stop_all(self) -> None:
        # SIGTERM to the main process (a warm shutdown), then SIGKILL to its whole group, so
        # no prefork child outlives the test and holds a connection to the test database.
        for _, proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=15)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.fixture
def celery_redis() -> Iterator[str]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()  # only this database: other tests and tools use other numbers
    yield REDIS_URL
    client.close()


@pytest.fixture
def celery_app(celery_redis: str) -> Iterator[Any]:
    """The test project's Celery app, publishing to and reading results from our Redis DB."""
    from testproject.celery import app

    saved = {key: app.conf[key] for key in ("broker_url", "result_backend")}
    app.conf.update(broker_url=celery_redis, result_backend=celery_redis)
    _forget_connections(app)
    yield app
    app.conf.update(saved)
    _forget_connections(app)


def _forget_connections(app: Any) -> None:
    """Drop the broker pool and result backend the app cached on first use (Celery 5
    internals), so the URLs set in ``app.conf`` take effect."""
    app._pool = None
    app._backend_cache = None
    vars(app._local).pop("backend", None)
    app.amqp._producer_pool = None


@pytest.fixture
def celery_procs(
    subprocess_env: dict[str, str], celery_redis: str, tmp_path: Path
) -> Iterator[CeleryProcesses]:
    queue = f"inbox-test-{uuid.uuid4().hex[:10]}"
    env = {
        **subprocess_env,
        "CELERY_BROKER_URL": celery_redis,
        "CELERY_RESULT_BACKEND": celery_redis,
        "CELERY_TASK_DEFAULT_QUEUE": queue,
        "INBOX_BEAT_PROCESS_EVERY": "0.5",
        "INBOX_BEAT_RECLAIM_EVERY": "1.0",
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
    }
    procs = CeleryProcesses(env=env, queue=queue, logs=tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


def queued_origins(client: redis.Redis, queue: str, task: str) -> set[int]:
    """Pids of the processes that sent the ``task`` messages waiting in ``queue``."""
    origins = set()
    for raw in client.lrange(queue, 0, -1):
        headers = json.loads(raw)["headers"]
        if headers["task"] == task:
            origins.add(int(headers["origin"].split("@")[0].removeprefix("gen")))
    return origins


def task_results(client: redis.Redis) -> list[dict[str, Any]]:
    """Every task result stored in our Redis database."""
    return [json.loads(client.get(key) or "null") for key in client.keys("celery-task-meta-*")]


def process_due_results(client: redis.Redis) -> list[dict[str, Any]]:
    return [
        meta["result"]
        for meta in task_results(client)
        if meta and meta["status"] == "SUCCESS" and "handled" in meta["result"]
    ]


def wait_until(
    condition: Callable[[], bool], procs: CeleryProcesses, timeout: float = 90.0
) -> None:
    """Poll ``condition`` (the database) until it holds; fail if a process died or time ran out."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return
        procs.assert_running()
        if time.monotonic() >= deadline:
            pytest.fail(f"gave up waiting after {timeout:.0f}s\n{procs.logs_text()}")
        time.sleep(0.25)


# --- 1. beat retries failures on its own --------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_beat_schedule_retries_failed_messages_exactly_once(
    celery_procs: CeleryProcesses,
) -> None:
    ids = [f"beat-{n}" for n in range(50)]
    for message_id in ids:
        outcome = deliver(
            consumer="effects",
            message_id=message_id,
            event_type="effect.write",
            payload={"fail_times": 1},
        )
        assert outcome == Outcome.FAILED
    assert InboxMessage.objects.filter(status=Status.FAILED).count() == 50
    assert not Effect.objects.exists(), "the failed first attempts committed nothing"

    # Nobody runs a command: only beat, which sends process_due twice a second, and a worker.
    # Two beat schedulers (a common misconfiguration) send every task twice: the worker only
    # starts once the queue holds process_due messages from both of them.
    beat_pids = {celery_procs.beat(f"beat-{n}").pid for n in range(2)}
    client = redis.Redis.from_url(REDIS_URL)
    wait_until(
        lambda: beat_pids <= queued_origins(client, celery_procs.queue, "django_inbox.process_due"),
        celery_procs,
    )
    celery_procs.worker()

    wait_until(
        lambda: InboxMessage.objects.filter(status=Status.COMPLETED).count() == 50, celery_procs
    )
    # Let a few more runs come (duplicates included): they find nothing to do. Every row was
    # handled by exactly one run, however many ran.
    done = len(process_due_results(client))
    wait_until(lambda: len(process_due_results(client)) >= done + 4, celery_procs)
    wait_until(lambda: sum(r["handled"] for r in process_due_results(client)) == 50, celery_procs)
    celery_procs.assert_running()
    runs = process_due_results(client)
    print(f"two beats: {len(runs)} process_due runs, handled {[r['handled'] for r in runs]}")
    assert sum(r["handled"] for r in runs) == 50
    rows = list(InboxMessage.objects.all())
    assert len(rows) == 50
    assert {row.status for row in rows} == {Status.COMPLETED}
    assert {row.attempts for row in rows} == {2}, "each failed once, then succeeded once"
    lost, doubled = lost_and_doubled(set(ids))
    print(f"two beats: lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)
    effects = list(Effect.objects.all())
    assert len(effects) == 50
    assert {effect.attempt for effect in effects} == {2}
    assert os.getpid() not in {effect.pid for effect in effects}, "the worker did it, not us"


@pytest.mark.postgres
@pytest.mark.slow
def test_worker_killed_inside_process_due_is_recovered_by_the_next_run(
    celery_procs: CeleryProcesses, tmp_path: Path
) -> None:
    kill_file = tmp_path / "kill-once"
    kill_file.touch()
    ids = [f"kill-{n}" for n in range(20)]
    for n, message_id in enumerate(ids):
        assert store(
            consumer="effects",
            message_id=message_id,
            event_type="effect.write",
            payload={"kill_file": str(kill_file)} if n == 5 else {},
        )

    celery_procs.worker()
    celery_procs.beat("beat")
    wait_until(
        lambda: InboxMessage.objects.filter(status=Status.COMPLETED).count() == 20, celery_procs
    )
    celery_procs.assert_running()

    assert not kill_file.exists(), "the handler ran and SIGKILLed the pool process"
    killed = InboxMessage.objects.get(message_id="kill-5")
    assert killed.attempts == 2
    assert [entry["type"] for entry in killed.history] == ["LeaseExpired"]
    others = InboxMessage.objects.exclude(message_id="kill-5")
    assert set(others.values_list("attempts", flat=True)) == {1}, "batch-mates not blamed"
    lost, doubled = lost_and_doubled(set(ids))
    print(f"worker killed inside process_due: lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)
    assert Effect.objects.count() == 20

    # Celery itself reports the run lost only later (billiard's lost-worker timeout, ~10 s):
    # the rows did not wait for it, the next scheduled run took them over once the lease ran out.
    client = redis.Redis.from_url(REDIS_URL)
    wait_until(lambda: bool(lost_runs(client)), celery_procs, timeout=60)
    [lost_run] = lost_runs(client)
    assert "SIGKILL" in lost_run["result"]["exc_message"][0]


def lost_runs(client: redis.Redis) -> list[dict[str, Any]]:
    """Results of tasks whose pool process died under them (``WorkerLostError``)."""
    return [
        meta
        for meta in task_results(client)
        if meta and meta["status"] == "FAILURE" and meta["result"]["exc_type"] == "WorkerLostError"
    ]


# --- 2. overlapping sweeper runs ----------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_overlapping_process_due_runs_process_each_row_once(
    celery_procs: CeleryProcesses, celery_app: Any
) -> None:
    from django_inbox.contrib.celery.tasks import process_due

    celery_procs.worker(concurrency=3)
    ids = [f"sweep-{n}" for n in range(1000)]
    with transaction.atomic():
        for message_id in ids:
            assert store(
                consumer="effects",
                message_id=message_id,
                event_type="effect.write",
                payload={"sleep": 0.003},
            )

    results = [
        process_due.apply_async(
            kwargs={"max_messages": None, "max_seconds": 120}, queue=celery_procs.queue
        )
        for _ in range(3)
    ]
    handled = []
    for result in results:
        try:
            value = result.get(timeout=180)
        except Exception:
            pytest.fail(f"task {result.id} failed\n{celery_procs.logs_text()}")
        handled.append(value["handled"])
        assert value["outcomes"] == ({"processed": value["handled"]} if value["handled"] else {})
    print(f"three overlapping process_due runs handled {handled}")

    assert sum(handled) == 1000
    assert sum(1 for n in handled if n) >= 2, f"the runs did not overlap: {handled}"
    assert InboxMessage.objects.filter(status=Status.COMPLETED).count() == 1000
    assert set(InboxMessage.objects.values_list("attempts", flat=True)) == {1}
    lost, doubled = lost_and_doubled(set(ids))
    assert (lost, doubled) == (0, 0)
    assert Effect.objects.count() == 1000


# --- 3. reclaim and purge through the worker ----------------------------------------------------


def _row(message_id: str, **changes: Any) -> InboxMessage:
    assert store(consumer="effects", message_id=message_id, event_type="effect.write", payload={})
    InboxMessage.objects.filter(consumer="effects", message_id=message_id).update(**changes)
    return InboxMessage.objects.get(consumer="effects", message_id=message_id)


@pytest.mark.postgres
@pytest.mark.slow
def test_reclaim_and_purge_tasks_run_in_the_worker(
    celery_procs: CeleryProcesses, celery_app: Any
) -> None:
    from django_inbox.contrib.celery.tasks import purge, reclaim, stats

    celery_procs.worker()
    now = timezone.now()
    long_ago = now - timedelta(days=60)  # past the default 30-day retention
    expired_lease = now - timedelta(minutes=5)
    stuck = _row(
        "stuck",
        status=Status.IN_PROGRESS,
        attempts=1,
        lease_id="lease-of-a-dead-worker",
        locked_until=expired_lease,
        next_attempt_at=expired_lease,
        updated_at=expired_lease,
    )
    completed = {"status": Status.COMPLETED, "attempts": 1}
    old_completed = _row("old-completed", **completed, processed_at=long_ago)
    fresh_completed = _row("fresh-completed", **completed, processed_at=now)
    old_dead = _row("old-dead", status=Status.DEAD, attempts=3, updated_at=long_ago)
    pending = [
        _row("old-received", received_at=long_ago, updated_at=long_ago),
        _row("old-failed", status=Status.FAILED, attempts=1, updated_at=long_ago),
        _row("old-parked", status=Status.PARKED, attempts=1, updated_at=long_ago),
    ]

    # The stats task sees what an operator should: a stuck row and a dead one.
    collected = stats.apply_async(queue=celery_procs.queue).get(timeout=90)
    assert collected["healthy"] is False
    assert {(p["kind"], p["consumer"]) for p in collected["problems"]} >= {
        ("stuck", "effects"),
        ("dead", "effects"),
    }
    assert collected["consumers"]["effects"]["stuck"] == 1

    reclaimed = reclaim.apply_async(queue=celery_procs.queue).get(timeout=90)
    assert reclaimed == {"failed": 1, "dead": 0, "released": 0}, celery_procs.logs_text()
    stuck.refresh_from_db()
    assert stuck.status == Status.FAILED
    assert stuck.lease_id == "" and stuck.locked_until is None
    assert stuck.attempts == 1
    [entry] = stuck.history
    assert (entry["kind"], entry["type"], entry["attempt"]) == ("error", "LeaseExpired", 1)
    assert entry["outcome"] == Status.FAILED

    # As beat sends it: no arguments, the configured retention (dead rows have none).
    purged = purge.apply_async(queue=celery_procs.queue).get(timeout=90)
    assert purged["deleted"] == {"completed": 1}, celery_procs.logs_text()
    assert purged["skipped"] == ["dead"]
    remaining = set(InboxMessage.objects.values_list("message_id", flat=True))
    assert old_completed.message_id not in remaining
    assert {fresh_completed.message_id, old_dead.message_id, stuck.message_id} <= remaining
    assert {row.message_id for row in pending} <= remaining

    # Arguments go through: statuses as a JSON list, an explicit age.
    purged = purge.apply_async(
        kwargs={"statuses": ["dead"], "older_than": 3600}, queue=celery_procs.queue
    ).get(timeout=90)
    assert purged["deleted"] == {"dead": 1}
    remaining = set(InboxMessage.objects.values_list("message_id", flat=True))
    assert remaining == {"stuck", "fresh-completed", *(row.message_id for row in pending)}
    celery_procs.assert_running()


# --- 4. the schedule itself ---------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_the_outbox_relay_task_publishes_for_a_bounded_time(
    celery_procs: CeleryProcesses, celery_app: Any
) -> None:
    from kombu import Connection, Queue

    from django_inbox.contrib.celery.tasks import outbox_relay
    from django_inbox.outbox import publish
    from django_inbox.outbox.models import OutboxMessage
    from tests import brokers

    queue = brokers.new_queue_name("outbox-celery")
    with Connection(brokers.RABBITMQ) as connection:
        Queue(queue, routing_key=queue, durable=True)(connection.default_channel).declare()
    try:
        ids = [publish("effect.write", {"n": n}, routing_key=queue) for n in range(50)]
        celery_procs.worker()
        result = outbox_relay.apply_async(
            kwargs={"broker_url": brokers.RABBITMQ, "max_seconds": 20.0}, queue=celery_procs.queue
        ).get(timeout=90)
        assert result == {"sent": 50, "failed": {}, "reconnects": 0, "reached": True}, (
            celery_procs.logs_text()
        )
        assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"sent"}
        with Connection(brokers.RABBITMQ) as connection:
            channel = connection.default_channel
            got = []
            while (message := channel.basic_get(queue, no_ack=True)) is not None:
                got.append(message.properties["message_id"])
        assert got == ids
    finally:
        with Connection(brokers.RABBITMQ) as connection:
            Queue(queue)(connection.default_channel).delete()
