"""Ordered consumers under an operator's actions: skips, replays past gaps and re-runs never
apply what an operator decided against, never stall without a problem, and versions waiting
behind an existing predecessor cost the sweep nothing. Each test failed before its fix."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from effects import inbox_handlers
from effects.models import Projection

from django_inbox import Outcome
from django_inbox.models import InboxKey, InboxMessage
from django_inbox.ordered import ordering
from django_inbox.ordered.gaps import park_expired_gaps
from django_inbox.services import collect, operator, purge, select, skipping
from tests import ordered
from tests.ordered import Versions, sent_cleared  # noqa: F401  (autouse)

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
CONSUMER = "projection"
ACTOR = {"actor": "alice (test)", "reason": "rebuild"}


VERSIONS = Versions(CONSUMER, "projection.apply", numbered=True)
send, put, row = VERSIONS.send, VERSIONS.put, VERSIONS.row


def policy(**changes: Any) -> Any:
    return ordered.policy(CONSUMER, **changes)


def drain(idle: float = 0.0) -> None:
    ordered.drain(CONSUMER, idle=idle)


def status(message_id: str) -> str:
    return str(InboxMessage.objects.get(consumer=CONSUMER, message_id=message_id).status)


def version(key: str) -> int:
    return Projection.objects.get(key=key).version


def rebuild(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``inbox_replay --key KEY --status completed --force --wait`` while workers run."""
    from django_inbox.management import following

    polls: list[int] = []

    def sleep(_: float) -> None:  # the command's poll: a worker (with its sweeps) meanwhile
        polls.append(1)
        assert len(polls) < 20, "inbox_replay --wait did not end"
        drain(idle=1.2)

    monkeypatch.setattr(following.time, "sleep", sleep)  # --wait's poll
    call_command(
        "inbox_replay", "--consumer", CONSUMER, "--key", key, "--status", "completed",
        "--force", "--reason", "rebuild", "--wait", "--no-input",
    )  # fmt: skip


def park_gaps() -> int:
    time.sleep(0.1)
    return park_expired_gaps(consumer=CONSUMER)


# --- finding 1: a rebuild past a stale row ends ------------------------------------------


def test_a_rebuild_past_a_sequence_only_a_stale_row_holds_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """v3 replayed past the gap, then the late v2 skipped as stale: the re-run planner saw a
    hole at 2, the gap sweep waited for "any row" at 2 and found the stale one: v3 waited for
    ever and ``--wait`` never ended."""
    with policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 3) == Outcome.WAITING
        assert park_gaps() == 1
        operator.replay(select(consumer=CONSUMER, statuses=["parked"]), **ACTOR)
        drain()
        assert send("K", 2) == Outcome.SKIPPED  # late: stale
        assert version("K") == 3

        rebuild("K", monkeypatch)

    assert (status("K-1"), status("K-2"), status("K-3")) == ("completed", "skipped", "completed")
    assert version("K") == 3
    assert Projection.objects.get(key="K").reruns == 2
    assert inbox_handlers.SENT == ["K-1", "K-3"]  # first runs only: the re-runs suppressed


def test_wait_follows_its_own_rerun_not_a_key_stuck_before(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Key A's re-run is held behind a dead version; a later ``--wait`` on key B counted A's
    rows too, and failed (or hung) on them."""
    for sequence in (1, 2, 3):
        put("A", sequence)
        put("B", sequence)
    drain()
    dead = row("A-2")
    dead.payload = {"n": 2, "reject": "the fixed handler rejects it"}
    dead.save(update_fields=["payload"])
    operator.replay(select(consumer=CONSUMER, keys=["A"], statuses=["completed"]), force=True,
                    **ACTOR)  # fmt: skip
    drain()
    assert (status("A-2"), status("A-3")) == ("dead", "waiting")

    rebuild("B", monkeypatch)  # exits 0: B's re-run is done

    assert [status(f"B-{n}") for n in (1, 2, 3)] == ["completed"] * 3
    assert Projection.objects.get(key="B").reruns == 3


# --- finding 2: a stale copy during a re-run -----------------------------------------------


def test_a_copy_of_a_version_arriving_during_a_rerun_is_stale_not_a_first_run() -> None:
    """The re-run rewound the key to 0; a copy of v2 under a new id was judged against 0,
    waited, and ran as a first run (its side effect made although the consumer suppresses
    them on re-runs), and the re-run's own v2 was then skipped as stale."""
    for sequence in (1, 2, 3):
        put("K", sequence)
    drain()
    inbox_handlers.SENT.clear()
    operator.replay(select(consumer=CONSUMER, keys=["K"], statuses=["completed"]), force=True,
                    **ACTOR)  # fmt: skip
    assert send("K", 2, message_id="K-2-again") == Outcome.SKIPPED  # deliver()
    key = InboxKey.objects.get(consumer=CONSUMER, key="K")
    assert (key.applied_sequence, key.rerun_through) == (0, 3)
    assert "before a re-run" in row("K-2-again").last_error
    put("K", 3, message_id="K-3-again")  # store(), then a worker
    assert send("K", 4) == Outcome.WAITING  # a new version waits for the re-run
    drain()

    assert status("K-3-again") == "skipped"
    assert [status(f"K-{n}") for n in (1, 2, 3, 4)] == ["completed"] * 4
    assert Projection.objects.get(key="K").reruns == 3
    assert version("K") == 4
    assert inbox_handlers.SENT == ["K-4"]  # the new version's first run, nothing else


# --- findings 3 and 4: an operator's skip is state ------------------------------------------


def _skipped_after_a_hole() -> None:
    """K: 1 applied, 2 never arrives, 3 skipped by an operator while it waited for 2, 4 after
    it; the operator passes the gap: 3 is skipped, 4 runs."""
    send("K", 1)
    assert send("K", 3) == Outcome.WAITING
    assert park_gaps() == 1
    skipping.skip(select(consumer=CONSUMER, message_ids=["K-3"]), **ACTOR)
    assert send("K", 4) == Outcome.WAITING
    park_gaps()
    operator.replay(select(consumer=CONSUMER, statuses=["parked"]), **ACTOR)
    drain()
    assert (status("K-3"), status("K-4")) == ("skipped", "completed")
    assert inbox_handlers.SENT == ["K-1", "K-4"]


def test_a_rebuild_never_applies_a_version_skipped_after_a_hole() -> None:
    """The re-run's gap sweep passed the hole at 2 with a history entry on the skipped v3,
    and the skip was read from the last history entry only: the rebuild applied v3."""
    with policy(gap_timeout=0.05):
        _skipped_after_a_hole()
        before = Projection.objects.get(key="K").value
        operator.replay(select(consumer=CONSUMER, keys=["K"], statuses=["completed"]),
                        force=True, **ACTOR)  # fmt: skip
        drain(idle=2.5)  # the sweep passes the hole (it looks every second)

    assert (status("K-1"), status("K-3"), status("K-4")) == ("completed", "skipped", "completed")
    assert row("K-3").skip_requested
    assert Projection.objects.get(key="K").value == before
    assert inbox_handlers.SENT == ["K-1", "K-4"]


@pytest.mark.postgres
def test_a_transient_error_while_skipping_never_runs_the_skipped_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A statement timeout while the worker recorded the skip appended an error entry; the
    retry saw no ``skip`` as the last entry and ran the skipped version."""
    send("K", 1)
    assert send("K", 3) == Outcome.WAITING
    skipping.skip(select(consumer=CONSUMER, message_ids=["K-3"]), **ACTOR)
    real = ordering.set_aside
    failures: list[int] = []

    def times_out_once(message: InboxMessage, *args: Any, **kwargs: Any) -> bool:
        if message.message_id == "K-3" and not failures:
            failures.append(1)
            with connection.cursor() as cursor:  # a real statement timeout, once
                cursor.execute("SET LOCAL statement_timeout = '10ms'")
                cursor.execute("SELECT pg_sleep(1)")
        return real(message, *args, **kwargs)

    monkeypatch.setattr(ordering, "set_aside", times_out_once)
    put("K", 2)
    drain()
    assert failures == [1]
    drain(idle=0.2)  # the retry after the backoff

    assert (status("K-2"), status("K-3")) == ("completed", "skipped")
    assert any(e.get("kind") == "error" for e in row("K-3").history)
    assert inbox_handlers.SENT == ["K-1", "K-2"]
    assert InboxKey.objects.get(consumer=CONSUMER, key="K").applied_sequence == 3


# --- findings 6 and 7: stalls are problems; rows behind a predecessor cost nothing -----------


def test_versions_behind_a_dead_one_have_no_deadline_and_cost_the_sweep_nothing() -> None:
    with policy(gap_timeout=0.05):
        assert send("K", 1, reject="dead") == Outcome.DEAD
        for sequence in range(2, 202):
            assert send("K", sequence) == Outcome.WAITING
        waiting = InboxMessage.objects.filter(status=Status.WAITING)
        assert waiting.count() == 200
        assert not waiting.filter(next_attempt_at__isnull=False).exists()
        time.sleep(0.1)
        with CaptureQueriesContext(connection) as queries:
            assert park_expired_gaps(consumer=CONSUMER) == 0
        assert len(queries) <= 3, [q["sql"] for q in queries]  # no row looked at

        problems = collect(consumer=CONSUMER).problems
        assert {p.kind for p in problems} == {"dead", "stalled"}
        assert "1 key(s) held up" in next(p.message for p in problems if p.kind == "stalled")

        # The dead version deleted: nothing would release 2 now. The purge gives it a gap
        # deadline; the sweep parks it for the missing 1; 3 … 201 wait behind it.
        purge(statuses=("dead",), older_than=0)
        assert row("K-2").next_attempt_at is not None
        assert park_gaps() == 1
        assert status("K-2") == "parked" and status("K-3") == "waiting"
        assert [p.kind for p in collect(consumer=CONSUMER).problems] == ["stalled"]

        operator.replay(select(consumer=CONSUMER, message_ids=["K-2"]), **ACTOR)
        drain()
    assert version("K") == 201
    assert not collect(consumer=CONSUMER).problems


def test_versions_behind_a_parked_one_are_a_problem() -> None:
    """Parked by its handler (not a problem alone), but later versions wait behind it."""
    send("K", 1)
    assert send("K", 2, park="look at it") == Outcome.PARKED
    assert not collect(consumer=CONSUMER).problems
    assert send("K", 3) == Outcome.WAITING
    assert [p.kind for p in collect(consumer=CONSUMER).problems] == ["stalled"]
    code = _stats_exit_code()
    assert code == 1


def _stats_exit_code() -> int:
    try:
        call_command("inbox_stats", "--consumer", CONSUMER, verbosity=0)
    except CommandError as exc:
        return exc.returncode
    return 0


def test_a_waiting_row_no_sweep_looked_at_is_a_problem() -> None:
    with policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 3) == Outcome.WAITING
    long_ago = timezone.now() - timedelta(hours=1)
    InboxMessage.objects.filter(message_id="K-3").update(next_attempt_at=long_ago)
    problems = collect(consumer=CONSUMER, max_pending_age=60).problems
    assert [p.kind for p in problems] == ["stalled"]
    assert "no worker looked at" in problems[0].message


def test_a_changed_gap_timeout_applies_to_rows_already_waiting() -> None:
    with policy(gap_timeout=3600):
        send("K", 1)
        assert send("K", 3) == Outcome.WAITING
    with policy(gap_timeout=0.05):  # shortened: applies at the next sweep
        assert park_expired_gaps(consumer=CONSUMER) == 0  # moved its deadline
        assert park_gaps() == 1
    assert status("K-3") == "parked"

    with policy(gap_timeout=0.05):
        assert send("K", 6) == Outcome.WAITING
    time.sleep(0.1)
    with policy(gap_timeout=3600):  # made longer: the row waits the new timeout
        assert park_expired_gaps(consumer=CONSUMER) == 0
    assert status("K-6") == "waiting"
    assert row("K-6").next_attempt_at > timezone.now() + timedelta(minutes=59)
