"""Operator actions: replay, park and retry now (``django_inbox.services``) and ``inbox_replay``.

The parts that run real processes; the rest is in ``tests/unit/test_services_operator.py``.
"""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from typing import Any

import pytest
from effects.models import Effect

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.services import park, replay, select
from tests.effects import effect_counts, lost_and_doubled
from tests.unit.test_services_operator import (
    Manage,
    Status,
    assert_replayed,
    drain,
    entries,
    make_rows,
    run,
    snapshot,
)


@pytest.mark.postgres
@pytest.mark.slow
def test_replay_command_then_worker_completes_each_dead_and_parked_row_once(
    manage: Manage,
) -> None:
    # Dead rows as a broken downstream left them: three failed attempts each.
    dead = make_rows(Status.DEAD, 5, prefix="was-dead", ago=timedelta(minutes=10))
    # Parked rows made by the operator action itself, from freshly stored messages.
    for n in range(3):
        assert store(
            consumer="effects", message_id=f"was-parked-{n}", event_type="effect.write", payload={}
        )
    parked_rows = select(message_ids=[f"was-parked-{n}" for n in range(3)])
    parked = park(parked_rows, actor="alice", reason="hold while we look", via="test")
    assert parked.changed == {"received": 3}
    before = {row.pk: row for row in InboxMessage.objects.all()}
    assert {row.status for row in before.values()} == {Status.DEAD, Status.PARKED}
    assert all(len(entries(row, "park")) == 1 for row in before.values() if row.status == "parked")

    code, out, err = run(manage, "inbox_replay", "--all", "--reason", "downstream fixed")

    assert code == 0, err
    assert "replayed 8 row(s) (dead 5, parked 3)" in out
    after = {row.pk: row for row in InboxMessage.objects.all()}
    assert after.keys() == before.keys(), "same rows, none created or deleted"
    for pk, row in after.items():
        assert_replayed(
            row, before[pk], reason="downstream fixed", via="command", by="(inbox_replay)"
        )
    assert Effect.objects.count() == 0, "replay itself runs no handler"

    code, out, err = run(manage, "inbox_process", "--consumer", "effects", "--until-idle", "1")

    assert code == 0, err
    expected = {row.message_id for row in before.values()}
    counts = effect_counts()
    lost, doubled = lost_and_doubled(expected)
    print(f"replayed 8 (5 dead, 3 parked) then processed: effects={counts}")
    assert (lost, doubled) == (0, 0)
    assert counts == dict.fromkeys(expected, 1)
    done = {row.pk: row for row in InboxMessage.objects.all()}
    assert {row.status for row in done.values()} == {Status.COMPLETED}
    assert {row.attempts for row in done.values()} == {1}
    for pk, row in done.items():
        assert row.history == after[pk].history, "completion keeps the history, replay included"
        assert [e["kind"] for e in row.history].count("replay") == 1
    assert [dead[0].pk] == [r.pk for r in done.values() if r.message_id == "was-dead-0"]


@pytest.mark.postgres
@pytest.mark.slow
def test_replaying_a_completed_row_needs_force_and_a_reason(manage: Manage) -> None:
    assert store(consumer="effects", message_id="done-1", event_type="effect.write", payload={})
    drain()
    assert effect_counts() == {"done-1": 1}
    row = InboxMessage.objects.get(message_id="done-1")
    assert row.status == Status.COMPLETED
    unchanged = snapshot([row.pk])

    # Not without --force: exit 1, nothing changed.
    code, out, err = run(manage, "inbox_replay", "--id", str(row.pk), "--status", "completed")
    assert code == 1, (out, err)
    assert "inbox_replay --force" in err
    assert "Traceback" not in err
    assert snapshot([row.pk]) == unchanged

    # --force without --reason: a usage error, exit 2, nothing changed.
    code, out, err = run(
        manage, "inbox_replay", "--id", str(row.pk), "--status", "completed", "--force"
    )
    assert code == 2, (out, err)
    assert "--reason" in err
    assert snapshot([row.pk]) == unchanged

    # --force --reason: replayed, and the handler runs (and applies its effect) again.
    code, out, err = run(
        manage,
        "inbox_replay",
        "--id",
        str(row.pk),
        "--status",
        "completed",
        "--force",
        "--reason",
        "rebuild the projection",
    )
    assert code == 0, err
    assert "replayed 1 row(s) (completed 1)" in out
    replayed = InboxMessage.objects.get(pk=row.pk)
    assert_replayed(
        replayed, row, reason="rebuild the projection", via="command", by="(inbox_replay)"
    )
    code, out, err = run(manage, "inbox_process", "--consumer", "effects", "--until-idle", "1")
    assert code == 0, err
    assert effect_counts() == {"done-1": 2}, "a forced replay runs the handler a second time"
    assert InboxMessage.objects.get(pk=row.pk).status == Status.COMPLETED


@pytest.mark.postgres
@pytest.mark.slow
def test_usage_errors_exit_2(manage: Manage) -> None:
    (row,) = make_rows(Status.FAILED, 1)
    unchanged = snapshot([row.pk])
    for args in (
        ["--status", "failed"],
        ["--status", "received"],
        ["--since", "yesterday-ish"],
        ["--id", "not-a-number"],
    ):
        code, out, err = run(manage, "inbox_replay", *args)
        assert code == 2, (args, out, err)
        assert "Traceback" not in err
    code, out, err = run(manage, "inbox_replay", "--status", "failed")
    assert "failed rows are retried on their own" in err
    assert snapshot([row.pk]) == unchanged


@pytest.mark.postgres
@pytest.mark.slow
def test_two_replay_commands_at_once_replay_each_row_once(manage: Manage) -> None:
    make_rows(Status.DEAD, 500, prefix="race")
    procs = [manage("inbox_replay", "--all", "--reason", f"operator {n}") for n in range(2)]
    replayed = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        (line,) = [line for line in out.splitlines() if line.startswith("inbox_replay:")]
        replayed.append(int(line.split()[2].replace(",", "")))

    print(f"two inbox_replay processes over 500 dead rows replayed {replayed}")
    assert sum(replayed) == 500, "each row counted by exactly one of them"
    rows = list(InboxMessage.objects.all())
    assert len(rows) == 500
    assert {row.status for row in rows} == {Status.RECEIVED}
    per_row = [len(entries(row, "replay")) for row in rows]
    assert per_row == [1] * 500, "exactly one replay entry per row"
    # Each row's entry names the process that replayed it; their counts add up.
    reasons = [entries(row, "replay")[0]["reason"] for row in rows]
    assert sorted(reasons.count(f"operator {n}") for n in range(2)) == sorted(replayed)


@pytest.mark.postgres
@pytest.mark.slow
def test_a_replayed_row_being_processed_cannot_be_replayed_again(manage: Manage) -> None:
    (row,) = make_rows(Status.DEAD, 1, prefix="busy", payload={"sleep": 4, "sleep_on_attempt": 1})
    assert replay(select(pks=[row.pk]), actor="erin", via="test").total == 1
    worker = manage(
        "inbox_process", "--consumer", "effects", "--until-idle", "1", env={"EFFECTS_LEASE": "60"}
    )
    deadline = time.monotonic() + 60
    while InboxMessage.objects.get(pk=row.pk).status != Status.IN_PROGRESS:
        assert time.monotonic() < deadline, "the worker never claimed the row"
        assert worker.poll() is None, worker.communicate()
        time.sleep(0.05)
    busy = snapshot([row.pk])

    code, out, err = run(
        manage,
        "inbox_replay",
        "--id",
        str(row.pk),
        "--status",
        "dead",
        "--status",
        "parked",
        "--status",
        "completed",
        "--force",
        "--reason",
        "again",
    )
    assert code == 0, err
    assert "replayed 0 row(s)" in out
    result = replay(select(pks=[row.pk]), actor="erin", reason="again", force=True, via="test")
    assert result.total == 0
    assert result.refused == {"in_progress (cannot replay from in_progress)": 1}
    assert snapshot([row.pk]) == busy

    out, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err
    done = InboxMessage.objects.get(pk=row.pk)
    assert done.status == Status.COMPLETED
    assert len(entries(done, "replay")) == 1
    assert effect_counts() == {"busy-0": 1}


@pytest.mark.postgres
def test_ctrl_c_while_waiting_for_a_rerun_is_one_line_and_leaves_the_rerun_going(
    manage: Manage,
) -> None:
    """``--wait`` follows the workers; Ctrl-C stops the following, not the re-run: one line
    saying so, a non-zero exit, no traceback."""
    assert store(consumer="effects", message_id="w-1", event_type="effect.write", payload={})
    drain()
    proc = manage(
        "inbox_replay", "--consumer", "effects", "--status", "completed", "--force",
        "--reason", "rebuild", "--wait", "--no-input", env={"PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    while not (line := proc.stdout.readline()).startswith("re-run "):  # following: no worker
        assert line, (seen, proc.communicate())
        seen.append(line)

    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        "CommandError: stopped following (interrupted); the re-run goes on in the workers: "
        "follow it with inbox_stats or the admin"
    ], err
    assert InboxMessage.objects.get(message_id="w-1").status == Status.RECEIVED  # still due


def _at_the_prompt(subprocess_env: dict[str, str], *args: str) -> tuple[Any, int]:
    """``inbox_replay`` with a terminal of its own (a pty: its input, output and errors, as in
    a shell), stopped at its question."""
    import os
    import pty
    import subprocess
    import sys

    from tests.conftest import MANAGE

    terminal, its_side = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(MANAGE), "inbox_replay", *args],
        env=subprocess_env, stdin=its_side, stdout=its_side, stderr=its_side,
    )  # fmt: skip
    os.close(its_side)
    asked = b""
    while b"[y/N]" not in asked:
        chunk = os.read(terminal, 1024)
        assert chunk, asked
        asked += chunk
    return proc, terminal


def _the_rest(terminal: int) -> str:
    """What the command wrote to its terminal after the question, until it ended (a command
    still writing or silent after a minute fails the test rather than hanging it)."""
    import os
    import select

    said = b""
    deadline = time.monotonic() + 60
    while True:
        assert select.select([terminal], [], [], max(0.0, deadline - time.monotonic()))[0], (
            f"the command did not end within a minute; it said {said!r}"
        )
        try:
            chunk = os.read(terminal, 1024)
        except OSError:  # the other side closed: the command ended
            break
        if not chunk:
            break
        said += chunk
    return said.decode("utf-8", "replace")


@pytest.mark.postgres
@pytest.mark.parametrize("answer", ["ctrl-d", "ctrl-c"])
def test_no_answer_at_the_question_replays_nothing_without_a_traceback(
    subprocess_env: dict[str, str], answer: str
) -> None:
    """Ctrl-D (end of input) and Ctrl-C at "Replay them? [y/N]" printed tracebacks."""
    import os

    (row,) = make_rows(Status.DEAD, 1, prefix="asked")
    before = snapshot([row.pk])
    proc, terminal = _at_the_prompt(subprocess_env, "--status", "dead")
    if answer == "ctrl-d":
        os.write(terminal, b"\x04")
    else:
        proc.send_signal(signal.SIGINT)
    said = _the_rest(terminal)  # its output and its errors: one terminal
    proc.wait(timeout=60)
    os.close(terminal)

    assert "Traceback" not in said, said
    if answer == "ctrl-d":
        assert proc.returncode == 0, said
        assert "cancelled; nothing replayed" in said
    else:
        assert proc.returncode == 130, said
        assert "CommandError: interrupted" in said, said
    assert snapshot([row.pk]) == before
