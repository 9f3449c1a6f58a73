"""Crash windows, proven with real processes killed by SIGKILL on the real PostgreSQL.

Every test ends by counting committed effects: lost = 0, doubled = 0.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.utils import timezone
from effects.models import Effect

from django_inbox import Outcome, deliver, store
from django_inbox.models import InboxMessage
from django_inbox.processing.attempts import process_claimed
from django_inbox.processing.claims import claim_batch
from tests.conftest import ROOT, restart_until_it_survives
from tests.effects import effect_counts, lost_and_doubled

pytestmark = [pytest.mark.server_db, pytest.mark.slow]
Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]


def run_deliver(
    env: dict[str, str], message_id: str, payload: dict[str, object]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.procs",
            "deliver",
            "effects",
            message_id,
            json.dumps(payload),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def store_effect(message_id: str, **payload: object) -> None:
    assert store(
        consumer="effects", message_id=message_id, event_type="effect.write", payload=payload
    )


def test_kill_inside_handler_after_write_before_commit(
    subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    kill_file = tmp_path / "kill-once"
    kill_file.touch()

    crashed = run_deliver(subprocess_env, "evt-1", {"kill_file": str(kill_file)})

    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert not kill_file.exists(), "the handler ran, wrote, then died"
    assert not Effect.objects.exists(), "nothing of the killed attempt may be visible"
    assert not InboxMessage.objects.exists()

    # The broker redelivers: the effect is applied exactly once.
    redelivered = run_deliver(subprocess_env, "evt-1", {"kill_file": str(kill_file)})
    assert redelivered.stdout.strip() == "processed", redelivered.stderr
    again = run_deliver(subprocess_env, "evt-1", {})
    assert again.stdout.strip() == "duplicate"

    lost, doubled = lost_and_doubled({"evt-1"})
    print(f"kill before commit (deliver): lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)
    assert InboxMessage.objects.get().status == Status.COMPLETED


def test_kill_inside_stored_message_handler_is_retried_once(manage: Manage, tmp_path: Path) -> None:
    kill_file = tmp_path / "kill-once"
    kill_file.touch()
    store_effect("evt-2", kill_file=str(kill_file))

    first = manage("inbox_process", "--consumer", "effects", "--until-idle", "0")
    first.wait(timeout=60)
    assert first.returncode == -signal.SIGKILL
    message = InboxMessage.objects.get()
    assert (message.status, message.attempts) == (Status.IN_PROGRESS, 1)
    assert not Effect.objects.exists()

    # A restarted worker waits out the dead worker's lease, then finishes the message.
    second = manage("inbox_process", "--consumer", "effects", "--until-idle", "5")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0, err

    message.refresh_from_db()
    assert (message.status, message.attempts) == (Status.COMPLETED, 2)
    assert [e["type"] for e in message.errors] == ["LeaseExpired"]
    assert list(Effect.objects.values_list("attempt", flat=True)) == [2]
    lost, doubled = lost_and_doubled({"evt-2"})
    print(f"kill before commit (inbox_process): lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)


def test_message_that_kills_every_worker_goes_dead(manage: Manage) -> None:
    healthy = [f"ok-{n}" for n in range(5)]
    store_effect("ok-first")
    store_effect("poison", kill="always")
    for message_id in healthy:
        store_effect(message_id)

    kills = restart_until_it_survives(
        lambda: manage("inbox_process", "--consumer", "effects", "--until-idle", "4"), bound=10
    )

    poison = InboxMessage.objects.get(message_id="poison")
    print(f"poison message: kills={kills} status={poison.status} attempts={poison.attempts}")
    assert kills == 3  # INBOX_CONSUMERS["effects"]["max_attempts"]
    assert poison.status == Status.DEAD
    assert poison.attempts == 3
    assert [e["type"] for e in poison.errors] == ["LeaseExpired"] * 3
    assert "giving up after 3 attempts" in poison.last_error
    # The others completed once each, and the poison's crashes cost them no attempt.
    others = InboxMessage.objects.exclude(message_id="poison")
    assert set(others.values_list("status", flat=True)) == {Status.COMPLETED}
    assert set(others.values_list("attempts", flat=True)) == {1}
    lost, doubled = lost_and_doubled({"ok-first", *healthy})
    assert (lost, doubled) == (0, 0)
    assert "poison" not in effect_counts()


def test_worker_whose_lease_was_taken_over_cannot_complete(manage: Manage) -> None:
    store_effect("evt-3", sleep=6, sleep_on_attempt=1)
    zombie = manage("inbox_process", "--consumer", "effects", "--max-messages", "1")

    message = InboxMessage.objects.get()
    deadline = time.monotonic() + 30
    while message.status != Status.IN_PROGRESS and time.monotonic() < deadline:
        time.sleep(0.05)
        message.refresh_from_db()
    assert message.status == Status.IN_PROGRESS
    # Wait out the zombie's lease (2 s) while it still sleeps inside its transaction.
    time.sleep(max(0.0, (message.locked_until - timezone.now()).total_seconds()) + 0.2)

    (taken_over,) = claim_batch("effects", 10)
    assert taken_over.attempts == 2
    assert process_claimed(taken_over) == Outcome.PROCESSED

    out, err = zombie.communicate(timeout=60)
    assert zombie.returncode == 0, err
    assert "in_progress 1" in out, out  # its fenced completion found the lease gone

    message.refresh_from_db()
    assert (message.status, message.attempts) == (Status.COMPLETED, 2)
    assert list(Effect.objects.values_list("attempt", flat=True)) == [2]
    lost, doubled = lost_and_doubled({"evt-3"})
    print(f"fenced completion: lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)


def test_sigterm_finishes_the_current_message_and_gives_back_the_rest(manage: Manage) -> None:
    store_effect("slow", sleep=2)
    waiting = [f"w-{n}" for n in range(20)]
    for message_id in waiting:
        store_effect(message_id)
    proc = manage("inbox_process", "--consumer", "effects", "--batch-size", "50")
    deadline = time.monotonic() + 30
    while not InboxMessage.objects.filter(status=Status.IN_PROGRESS).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)

    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)

    assert proc.returncode == 0, err
    assert "processed 1" in out
    assert InboxMessage.objects.get(message_id="slow").status == Status.COMPLETED
    rest = InboxMessage.objects.filter(message_id__in=waiting)
    assert set(rest.values_list("status", flat=True)) == {Status.RECEIVED}
    assert set(rest.values_list("attempts", flat=True)) == {0}
    assert effect_counts() == {"slow": 1}


def test_second_signal_rolls_back_and_exits_non_zero(manage: Manage) -> None:
    store_effect("slow", sleep=5)
    proc = manage("inbox_process", "--consumer", "effects")
    deadline = time.monotonic() + 30
    while not InboxMessage.objects.filter(status=Status.IN_PROGRESS).exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # inside the handler's sleep

    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=30)

    assert proc.returncode == 1
    assert not Effect.objects.exists(), "the interrupted attempt must be rolled back"
    message = InboxMessage.objects.get()
    assert (message.status, message.attempts) == (Status.IN_PROGRESS, 1)
    assert (
        deliver(consumer="effects", message_id="slow", event_type="effect.write", payload={})
        == Outcome.IN_PROGRESS
    )


def test_misconfigured_worker_refuses_to_start_with_exit_code_2(manage: Manage) -> None:
    proc = manage("inbox_process", env={"EFFECTS_LEASE": "0.2"})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "django_inbox.E004" in err
