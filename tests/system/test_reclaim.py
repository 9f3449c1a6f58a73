"""``inbox_reclaim``: rows of workers that died (SIGKILL) or hang (SIGSTOP) come back, once.

The parts that run real processes; the rest is in ``tests/unit/test_services_reclaim.py``.
"""

from __future__ import annotations

import signal
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from effects.models import Effect

from django_inbox.models import InboxMessage
from tests.effects import lost_and_doubled
from tests.unit.test_services_reclaim import (
    Manage,
    Status,
    counts,
    finish,
    lease_expired,
    snapshot,
    store_effect,
    stuck,
    wait_in_handler,
)


@pytest.mark.server_db
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


@pytest.mark.server_db
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


@pytest.mark.server_db
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


@pytest.mark.server_db
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


@pytest.mark.server_db
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
