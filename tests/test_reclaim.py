"""``inbox_reclaim``: rows of workers that died (SIGKILL) or hang (SIGSTOP) come back, once.

The process-based tests use real ``manage.py`` workers on PostgreSQL and end by counting
committed effects (lost = 0, doubled = 0). The rule tests set stuck rows up directly in the
database and run the command in-process, on any database.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from effects.models import Effect

from django_inbox import store
from django_inbox.models import InboxMessage
from tests.effects import lost_and_doubled

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]
RECLAIMED = re.compile(
    r"inbox_reclaim: (?:would reclaim|reclaimed) (\d+) row\(s\): (\d+) failed .*?, (\d+) dead, "
    r"(\d+) released"
)
#: Columns reclaim may change; a row it must leave alone keeps all of them.
SNAPSHOT = (
    "status",
    "attempts",
    "history",
    "last_error",
    "lease_id",
    "locked_until",
    "next_attempt_at",
    "updated_at",
)


def store_effect(message_id: str, **payload: object) -> InboxMessage:
    assert store(
        consumer="effects", message_id=message_id, event_type="effect.write", payload=payload
    )
    return InboxMessage.objects.get(consumer="effects", message_id=message_id)


def stuck(
    message_id: str,
    *,
    attempts: int = 1,
    lease_id: str | None = None,
    claimed_ago: float = 60.0,
    expires_in: float = -30.0,
) -> InboxMessage:
    """A row left ``in_progress`` by a claim ``claimed_ago`` seconds ago (lease expired)."""
    row = store_effect(message_id)
    now = timezone.now()
    until = now + timedelta(seconds=expires_in)
    InboxMessage.objects.filter(pk=row.pk).update(
        status=Status.IN_PROGRESS,
        attempts=attempts,
        lease_id=lease_id or uuid.uuid4().hex,
        locked_until=until,
        next_attempt_at=until,
        updated_at=now - timedelta(seconds=claimed_ago),
    )
    row.refresh_from_db()
    return row


def snapshot(row: InboxMessage) -> dict[str, Any]:
    return dict(InboxMessage.objects.filter(pk=row.pk).values(*SNAPSHOT).get())


def reclaim(*args: str) -> tuple[str, tuple[int, int, int, int]]:
    """Run ``inbox_reclaim`` in-process; return its output and (total, failed, dead, released)."""
    out = StringIO()
    call_command("inbox_reclaim", *args, stdout=out)
    return out.getvalue(), counts(out.getvalue())


def counts(out: str) -> tuple[int, int, int, int]:
    match = RECLAIMED.search(out)
    assert match, out
    return tuple(int(n) for n in match.groups())  # type: ignore[return-value]


def lease_expired(row: InboxMessage) -> None:
    """Wait until the lease of ``row`` (as stored now) has passed."""
    row.refresh_from_db()
    assert row.locked_until is not None
    left = (row.locked_until - timezone.now()).total_seconds()
    time.sleep(max(0.0, left) + 0.2)
    assert timezone.now() > row.locked_until


def wait_in_handler(proc: subprocess.Popen[str], row: InboxMessage) -> None:
    """Poll the database until a worker has written its effect and sleeps in the handler.

    The handler's insert is uncommitted, so it shows as a backend ``idle in transaction``
    whose last statement inserted into the effects table.
    """
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state = 'idle in transaction' "
                "AND query LIKE %s",
                ['INSERT INTO "effects_effect"%'],
            )
            (inside,) = cursor.fetchone()
        row.refresh_from_db()
        if inside and row.status == Status.IN_PROGRESS:
            return
        assert time.monotonic() < deadline, "the worker never reached its handler"
        time.sleep(0.05)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


# --- (a) a worker SIGKILLed in its handler ---------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_reclaim_after_sigkill_counts_the_attempt_then_a_worker_completes_it(
    manage: Manage, tmp_path: Path
) -> None:
    kill_file = tmp_path / "kill-once"
    kill_file.touch()
    row = store_effect("killed", kill_file=str(kill_file))

    crashed = manage("inbox_process", "--consumer", "effects", "--until-idle", "0")
    crashed.communicate(timeout=60)
    assert crashed.returncode == -signal.SIGKILL
    assert not kill_file.exists(), "the handler ran, wrote, then died"
    row.refresh_from_db()
    assert (row.status, row.attempts, row.errors) == (Status.IN_PROGRESS, 1, [])
    assert not Effect.objects.exists()

    lease_expired(row)
    out = finish(manage("inbox_reclaim"))
    assert counts(out) == (1, 1, 0, 0), out

    row.refresh_from_db()
    assert (row.status, row.attempts) == (Status.FAILED, 1)
    assert (row.lease_id, row.locked_until) == ("", None)
    (entry,) = row.errors
    assert (entry["type"], entry["attempt"], entry["outcome"]) == ("LeaseExpired", 1, "failed")
    assert entry["retry_at"] is not None
    assert row.next_attempt_at == datetime.fromisoformat(entry["retry_at"])
    assert row.last_error.startswith("LeaseExpired: attempt 1 did not finish within its lease")

    out = finish(manage("inbox_process", "--consumer", "effects", "--until-idle", "1"))
    assert "processed 1" in out, out
    row.refresh_from_db()
    assert (row.status, row.attempts) == (Status.COMPLETED, 2)
    assert [e["type"] for e in row.errors] == ["LeaseExpired"]
    assert list(Effect.objects.values_list("attempt", flat=True)) == [2]
    lost, doubled = lost_and_doubled({"killed"})
    print(f"SIGKILL then inbox_reclaim: lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)


# --- (b) a worker SIGSTOPped in its handler: a zombie --------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_zombie_worker_woken_after_reclaim_is_fenced(manage: Manage) -> None:
    row = store_effect("zombie", sleep=4, sleep_on_attempt=1)
    zombie = manage("inbox_process", "--consumer", "effects", "--until-idle", "1")
    try:
        wait_in_handler(zombie, row)
        zombie.send_signal(signal.SIGSTOP)
        row.refresh_from_db()
        assert (row.status, row.attempts) == (Status.IN_PROGRESS, 1), "stopped too late"
        zombie_lease = row.lease_id

        lease_expired(row)
        out = finish(manage("inbox_reclaim", "--consumer", "effects"))
        assert counts(out) == (1, 1, 0, 0), out
        row.refresh_from_db()
        assert (row.status, row.attempts, row.lease_id) == (Status.FAILED, 1, "")
        assert [(e["type"], e["attempt"]) for e in row.errors] == [("LeaseExpired", 1)]

        out = finish(manage("inbox_process", "--consumer", "effects", "--until-idle", "1"))
        assert "processed 1" in out, out
        row.refresh_from_db()
        assert (row.status, row.attempts) == (Status.COMPLETED, 2)
        assert list(Effect.objects.values_list("attempt", flat=True)) == [2]
    finally:
        zombie.send_signal(signal.SIGCONT)

    # The zombie wakes up, finishes its handler and tries to complete with its old lease.
    out = finish(zombie)
    assert "in_progress 1" in out, out  # its fenced completion matched nothing
    row.refresh_from_db()
    assert zombie_lease and row.lease_id == ""
    assert (row.status, row.attempts) == (Status.COMPLETED, 2)
    assert [e["type"] for e in row.errors] == ["LeaseExpired"]
    (effect,) = Effect.objects.all()
    assert effect.attempt == 2
    assert effect.pid != zombie.pid, "the zombie's effect was rolled back"
    lost, doubled = lost_and_doubled({"zombie"})
    print(f"SIGSTOP zombie fenced after inbox_reclaim: lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)


# --- (c) live leases are never touched -------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_reclaim_leaves_a_stopped_worker_within_its_lease_alone(manage: Manage) -> None:
    row = store_effect("live", sleep=30, sleep_on_attempt=1)
    worker = manage(
        "inbox_process", "--consumer", "effects", "--until-idle", "1", env={"EFFECTS_LEASE": "120"}
    )
    try:
        wait_in_handler(worker, row)
        worker.send_signal(signal.SIGSTOP)
        # A dead worker's row next to it (made now, so the stopped worker cannot take it over).
        expired = stuck("expired")
        before = snapshot(row)
        assert before["status"] == Status.IN_PROGRESS
        assert before["locked_until"] > timezone.now() + timedelta(seconds=60)

        out = finish(manage("inbox_reclaim", "-v", "2"))

        assert counts(out) == (1, 1, 0, 0), out
        assert "effects expired -> failed" in out
        assert "live" not in out
        assert snapshot(row) == before
        assert InboxMessage.objects.get(pk=expired.pk).status == Status.FAILED
    finally:
        worker.kill()
        worker.communicate(timeout=60)
    assert not Effect.objects.filter(message_id="live").exists()


@pytest.mark.django_db(transaction=True)
def test_reclaim_never_touches_a_live_lease() -> None:
    live = stuck("live", expires_in=300, claimed_ago=3600)
    batch_lease = uuid.uuid4().hex
    live_mates = [stuck(f"live-mate-{n}", lease_id=batch_lease, expires_in=300) for n in range(3)]
    expired = stuck("expired")
    watched = [live, *live_mates]
    before = [snapshot(row) for row in watched]

    out, result = reclaim("-v", "2")

    assert result == (1, 1, 0, 0), out
    assert [snapshot(row) for row in watched] == before
    assert InboxMessage.objects.get(pk=expired.pk).status == Status.FAILED
    # Nor when run again, for this consumer only.
    assert reclaim("--consumer", "effects")[1] == (0, 0, 0, 0)
    assert [snapshot(row) for row in watched] == before


# --- (d) --older-than, --dry-run, dead, blame ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_older_than_leaves_recent_claims() -> None:
    old = stuck("old", claimed_ago=600)
    recent = stuck("recent", claimed_ago=30)
    recent_before = snapshot(recent)

    out, result = reclaim("--older-than", "5m", "-v", "2")

    assert result == (1, 1, 0, 0), out
    assert "effects old -> failed" in out
    assert snapshot(recent) == recent_before
    old.refresh_from_db()
    assert (old.status, [e["type"] for e in old.errors]) == (Status.FAILED, ["LeaseExpired"])

    assert reclaim("--older-than", "10s")[1] == (1, 1, 0, 0)
    recent.refresh_from_db()
    assert recent.status == Status.FAILED


@pytest.mark.django_db(transaction=True)
def test_dry_run_changes_nothing_and_prints_what_it_would_do() -> None:
    rows = [
        stuck("would-fail", attempts=1),
        stuck("would-die", attempts=3),
        *[stuck(f"batch-{n}", lease_id="l" * 32, attempts=2) for n in range(3)],
    ]
    before = [snapshot(row) for row in rows]

    out, result = reclaim("--dry-run", "-v", "2")

    assert result == (5, 2, 1, 2), out
    assert "inbox_reclaim: would reclaim 5 row(s)" in out
    for line in (
        "effects would-fail -> failed",
        "effects would-die -> dead",
        "effects batch-0 -> failed",
        "effects batch-1 -> failed",
        "effects batch-2 -> failed",
    ):
        assert line in out, out
    assert [snapshot(row) for row in rows] == before

    # The real run does what the dry run said.
    real, result = reclaim("-v", "2")
    assert result == (5, 2, 1, 2), real
    assert sorted(real.splitlines()[:-1]) == sorted(out.splitlines()[:-1])


@pytest.mark.django_db(transaction=True)
def test_reclaimed_row_past_max_attempts_goes_dead() -> None:
    row = stuck("last-chance", attempts=3)  # INBOX_CONSUMERS["effects"]["max_attempts"]

    out, result = reclaim()

    assert result == (1, 0, 1, 0), out
    row.refresh_from_db()
    assert (row.status, row.attempts, row.next_attempt_at) == (Status.DEAD, 3, None)
    assert (row.lease_id, row.locked_until) == ("", None)
    (entry,) = row.errors
    assert (entry["type"], entry["attempt"], entry["outcome"]) == ("LeaseExpired", 3, "dead")
    assert entry["retry_at"] is None
    assert "giving up after 3 attempts" in row.last_error
    assert not InboxMessage.objects.due().exists()


@pytest.mark.django_db(transaction=True)
def test_only_the_running_row_of_a_dead_workers_batch_is_blamed() -> None:
    lease = uuid.uuid4().hex
    first = stuck("batch-first", lease_id=lease, attempts=2)
    fresh = stuck("batch-fresh", lease_id=lease, attempts=1)
    retried = stuck("batch-retried", lease_id=lease, attempts=3)

    out, result = reclaim()

    assert result == (3, 1, 0, 2), out
    first.refresh_from_db()
    assert (first.status, first.attempts) == (Status.FAILED, 2)
    assert [(e["type"], e["attempt"]) for e in first.errors] == [("LeaseExpired", 2)]
    fresh.refresh_from_db()
    assert (fresh.status, fresh.attempts, fresh.history) == (Status.RECEIVED, 0, [])
    retried.refresh_from_db()
    assert (retried.status, retried.attempts, retried.history) == (Status.FAILED, 2, [])
    for row in (fresh, retried):
        assert (row.lease_id, row.locked_until) == ("", None)
        assert row.next_attempt_at is not None and row.next_attempt_at <= timezone.now()
    due = set(InboxMessage.objects.due().values_list("message_id", flat=True))
    assert {"batch-fresh", "batch-retried"} <= due


@pytest.mark.django_db(transaction=True)
def test_blame_holds_when_a_batch_is_split_across_reclaim_transactions() -> None:
    """A dead worker's batch larger than ``--batch-size`` still blames only its lowest row."""
    groups = []
    for g in range(3):
        lease = uuid.uuid4().hex
        groups.append([stuck(f"g{g}-{n}", lease_id=lease) for n in range(4)])

    out, result = reclaim("--batch-size", "3")

    assert result == (12, 3, 0, 9), out
    for group in groups:
        statuses = [InboxMessage.objects.get(pk=row.pk) for row in group]
        assert [(r.status, r.attempts, len(r.errors)) for r in statuses] == [
            (Status.FAILED, 1, 1),
            *[(Status.RECEIVED, 0, 0)] * 3,
        ]


# --- (e) two inbox_reclaim processes at once -------------------------------------------------


@pytest.mark.postgres
@pytest.mark.slow
def test_two_reclaims_at_once_reclaim_each_row_once(manage: Manage) -> None:
    rows = [stuck(f"stuck-{n:03d}") for n in range(200)]
    assert len({row.lease_id for row in rows}) == 200

    runs = [manage("inbox_reclaim", "--batch-size", "5") for _ in range(2)]
    results = [counts(finish(run)) for run in runs]

    print(f"two concurrent inbox_reclaim over 200 rows: {results}")
    assert sum(total for total, *_ in results) == 200
    assert sum(failed for _, failed, *_ in results) == 200
    for row in InboxMessage.objects.all():
        assert (row.status, row.attempts) == (Status.FAILED, 1), row.message_id
        assert [(e["type"], e["attempt"]) for e in row.errors] == [("LeaseExpired", 1)]
        assert row.lease_id == ""
    assert not InboxMessage.objects.filter(status=Status.IN_PROGRESS).exists()


@pytest.mark.postgres
@pytest.mark.slow
def test_two_reclaims_at_once_blame_one_row_per_dead_batch(manage: Manage) -> None:
    groups = [
        [stuck(f"b{g:02d}-{n}", lease_id=lease) for n in range(5)]
        for g, lease in enumerate(uuid.uuid4().hex for _ in range(40))
    ]

    runs = [manage("inbox_reclaim", "--batch-size", "3") for _ in range(2)]
    results = [counts(finish(run)) for run in runs]
    # Batches two runs held parts of at once are left for a later run, never split.
    leftover = counts(finish(manage("inbox_reclaim")))

    print(f"two concurrent inbox_reclaim over 40 batches of 5: {results}, then {leftover}")
    assert sum(r[0] for r in [*results, leftover]) == 200
    assert sum(r[1] for r in [*results, leftover]) == 40
    assert sum(r[3] for r in [*results, leftover]) == 160
    for group in groups:
        got = [InboxMessage.objects.get(pk=row.pk) for row in group]
        assert [(r.status, r.attempts, [e["type"] for e in r.errors]) for r in got] == [
            (Status.FAILED, 1, ["LeaseExpired"]),
            *[(Status.RECEIVED, 0, [])] * 4,
        ], group[0].message_id
