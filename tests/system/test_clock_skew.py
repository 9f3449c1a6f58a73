"""Workers whose host clock is minutes off: leases are computed on the database's clock.

Each test runs real ``inbox_process`` workers, one of them with its clock shifted by five
minutes (``INBOX_TEST_CLOCK_SKEW``: the test project shifts Django's clock, which is the one
the inbox reads; the database's is left alone). Without the correction of
:mod:`django_inbox.clock` a worker ahead takes a live lease for an expired one, a worker behind
writes leases the others take for expired, and a worker ahead that dies holds its rows five
minutes past its lease: each test fails then.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

import pytest
from effects.models import Effect

from django_inbox import clock, store
from django_inbox.models import InboxMessage

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]
SKEW = 300.0


def worker(manage: Manage, skew: float, lease: float, *args: str) -> subprocess.Popen[str]:
    return manage(
        "inbox_process", "--consumer", "effects", *args,
        env={
            "INBOX_TEST_CLOCK_SKEW": str(skew),
            "EFFECTS_LEASE": str(lease),
            "INBOX_LOG_LEVEL": "WARNING",
        },
    )  # fmt: skip


def wait_for(status: str, message_id: str, timeout: float = 60.0) -> InboxMessage:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = InboxMessage.objects.get(message_id=message_id)
        if row.status == status:
            return row
        time.sleep(0.1)
    raise AssertionError(f"{message_id} did not become {status} in {timeout:.0f} s")


def run_alongside(holder: subprocess.Popen[str], other: subprocess.Popen[str]) -> str:
    """Let ``other`` (``--until-idle``) run to its end while ``holder`` holds the row."""
    _out, err = other.communicate(timeout=60)
    assert other.returncode == 0, err[-3000:]
    assert InboxMessage.objects.get(message_id="held").status == Status.IN_PROGRESS, (
        "the holder finished before the other worker was done: the test proves nothing"
    )
    return err


def held_message(sleep: float) -> None:
    store(
        consumer="effects",
        message_id="held",
        event_type="effect.write",
        payload={"sleep": sleep, "sleep_on_attempt": 1},
    )


def finish(holder: subprocess.Popen[str]) -> None:
    wait_for(Status.COMPLETED, "held", timeout=90)
    holder.send_signal(signal.SIGTERM)
    holder.communicate(timeout=60)


def test_a_worker_whose_clock_is_ahead_leaves_a_live_lease_alone(
    manage: Manage, transactional_db: None
) -> None:
    held_message(sleep=15)
    holder = worker(manage, 0, 60)
    wait_for(Status.IN_PROGRESS, "held")
    err = run_alongside(holder, worker(manage, SKEW, 60, "--until-idle", "2"))
    assert "clock is 300" in err and "ahead of the database's" in err, err[-2000:]
    finish(holder)
    row = InboxMessage.objects.get(message_id="held")
    assert row.attempts == 1, row.history
    assert list(Effect.objects.values_list("pid", "attempt")) == [(holder.pid, 1)]


def test_a_worker_whose_clock_is_behind_writes_leases_the_others_respect(
    manage: Manage, transactional_db: None
) -> None:
    held_message(sleep=15)
    holder = worker(manage, -SKEW, 60)
    row = wait_for(Status.IN_PROGRESS, "held")
    lease_left = (row.locked_until - clock.now()).total_seconds()
    assert 30 < lease_left <= 61, lease_left  # on the database's clock, not 5 minutes ago
    run_alongside(holder, worker(manage, 0, 60, "--until-idle", "2"))
    finish(holder)
    row = InboxMessage.objects.get(message_id="held")
    assert row.attempts == 1, row.history
    assert list(Effect.objects.values_list("pid", "attempt")) == [(holder.pid, 1)]


def test_the_lease_of_a_dead_worker_whose_clock_was_ahead_ends_on_time(
    manage: Manage, transactional_db: None
) -> None:
    held_message(sleep=60)
    ahead = worker(manage, SKEW, 4)
    row = wait_for(Status.IN_PROGRESS, "held")
    assert (row.locked_until - clock.now()).total_seconds() <= 5, "lease on the wrong clock"
    ahead.send_signal(signal.SIGKILL)
    ahead.communicate(timeout=30)
    taker = worker(manage, 0, 4, "--until-idle", "8")
    _out, err = taker.communicate(timeout=90)
    assert taker.returncode == 0, err[-3000:]
    row = InboxMessage.objects.get(message_id="held")
    assert row.status == Status.COMPLETED, (row.status, row.locked_until, err[-2000:])
    assert list(Effect.objects.values_list("pid", flat=True)) == [taker.pid]
