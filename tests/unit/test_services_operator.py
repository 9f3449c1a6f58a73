"""Operator actions: replay, park and retry now (``django_inbox.services``) and ``inbox_replay``.

Every action changes rows in place (same pk, same message id), keeps their history and appends
an entry naming who, how and why. Replayed rows are then processed for real and their effects
counted: each replayed message applies its effect exactly once.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone
from effects.models import Effect

from django_inbox import history, store
from django_inbox.models import InboxMessage
from django_inbox.services import park, process_due, replay, retry_now, select
from tests.conftest import handler
from tests.effects import effect_counts

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]
transactional = pytest.mark.django_db(transaction=True)


# --- helpers -------------------------------------------------------------------------------


def make_rows(
    status: str,
    n: int = 1,
    *,
    prefix: str | None = None,
    consumer: str = "effects",
    event_type: str = "effect.write",
    payload: dict[str, Any] | None = None,
    attempts: int | None = None,
    ago: timedelta = timedelta(0),
    next_attempt_at: datetime | None = None,
) -> list[InboxMessage]:
    """``n`` rows as they look in ``status`` (dead/failed ones with one error entry per attempt)."""
    now = timezone.now()
    at = now - ago
    prefix = prefix or f"{consumer}-{status}"
    if attempts is None:
        attempts = {"dead": 3, "failed": 1, "completed": 1}.get(status, 0)
    errors = [
        history.error_entry(
            None,
            attempt=attempt,
            at=at,
            outcome=Status.DEAD if attempt == attempts else Status.FAILED,
            error_type="RuntimeError",
            message="downstream was down",
        )
        for attempt in range(1, attempts + 1)
        if status in (Status.DEAD, Status.FAILED)
    ]
    if next_attempt_at is None and status in (Status.RECEIVED, Status.FAILED):
        next_attempt_at = at
    locked_until = None
    if status == Status.IN_PROGRESS:
        locked_until = next_attempt_at = next_attempt_at or now + timedelta(minutes=5)
    rows = [
        InboxMessage(
            consumer=consumer,
            message_id=f"{prefix}-{i}",
            event_type=event_type,
            payload=payload if payload is not None else {},
            status=status,
            attempts=attempts,
            history=errors,
            last_error=history.summary(errors[-1]) if errors else "",
            received_at=at,
            updated_at=at,
            next_attempt_at=next_attempt_at,
            locked_until=locked_until,
            lease_id="a" * 32 if status == Status.IN_PROGRESS else "",
            processed_at=at if status == Status.COMPLETED else None,
        )
        for i in range(n)
    ]
    return InboxMessage.objects.bulk_create(rows, batch_size=2000)


def snapshot(pks: list[int]) -> dict[int, tuple[Any, ...]]:
    """Everything an action may change, per row."""
    return {
        row[0]: row[1:]
        for row in InboxMessage.objects.filter(pk__in=pks).values_list(
            "pk",
            "message_id",
            "status",
            "attempts",
            "history",
            "next_attempt_at",
            "locked_until",
            "updated_at",
            "processed_at",
        )
    }


def entries(row: InboxMessage, kind: str) -> list[dict[str, Any]]:
    return [entry for entry in row.history if entry["kind"] == kind]


def run(manage: Manage, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = manage(*args, env=env)
    out, err = proc.communicate(timeout=180)
    return proc.returncode, out, err


def replay_command(*args: str) -> tuple[int, str]:
    """``inbox_replay`` in this process: (exit code, stdout)."""
    from io import StringIO

    out = StringIO()
    try:
        call_command("inbox_replay", *args, stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


def drain(deadline: float = 60.0) -> None:
    """Process in this process until nothing is received, failed or in progress."""
    stop = time.monotonic() + deadline
    while InboxMessage.objects.pending().exists():
        assert time.monotonic() < stop, "rows still pending after the deadline"
        if not process_due().handled:
            time.sleep(0.02)


def assert_replayed(
    row: InboxMessage,
    before: InboxMessage,
    *,
    reason: str,
    via: str,
    by: str | None = None,
) -> dict[str, Any]:
    """``row`` is ``before`` replayed once: same row, history kept, one replay entry appended."""
    assert (row.pk, row.message_id, row.consumer) == (
        before.pk,
        before.message_id,
        before.consumer,
    )
    assert row.status == Status.RECEIVED
    assert row.attempts == 0
    assert row.next_attempt_at is not None and row.next_attempt_at <= timezone.now()
    assert row.locked_until is None and row.lease_id == "" and row.processed_at is None
    assert row.history[: len(before.history)] == before.history, "earlier history was kept"
    assert len(row.history) == len(before.history) + 1
    entry: dict[str, Any] = row.history[-1]
    assert entry["kind"] == "replay"
    assert entry["from"] == before.status
    assert entry["attempts"] == before.attempts
    assert entry["reason"] == reason
    assert entry["via"] == via
    if by is not None:
        assert by in entry["by"], entry
    assert datetime.fromisoformat(entry["at"]) <= timezone.now()
    return entry


# --- replay: dead and parked rows, processed for real -------------------------------------


@transactional
def test_replay_of_rows_that_went_dead_for_real_runs_the_fixed_handler_once() -> None:
    """A handler fails until it is fixed: its messages go dead through the real worker, and a
    replay then completes each once; the failed attempts left no effect."""
    state = {"broken": True}

    def flaky(message: InboxMessage) -> None:
        Effect.objects.create(
            consumer="effects", message_id=message.message_id, attempt=message.attempts, pid=0
        )
        if state["broken"]:
            raise RuntimeError(f"bug on attempt {message.attempts}")

    with handler("replay.flaky", "effects", flaky):
        ids = [f"flaky-{n}" for n in range(4)]
        for message_id in ids:
            assert store(
                consumer="effects", message_id=message_id, event_type="replay.flaky", payload={}
            )
        drain()
        went_dead = {row.pk: row for row in InboxMessage.objects.all()}
        assert {row.status for row in went_dead.values()} == {Status.DEAD}
        assert {row.attempts for row in went_dead.values()} == {3}
        assert all(len(row.errors) == 3 for row in went_dead.values())
        assert Effect.objects.count() == 0, "failed attempts roll their writes back"

        state["broken"] = False
        result = replay(
            select(event_types=["replay.flaky"], statuses=["dead", "parked"]),
            actor="bob",
            reason="bug fixed in 1.2.3",
            via="test",
        )

        assert (result.total, result.changed, dict(result.refused)) == (4, {"dead": 4}, {})
        assert sorted(pk for pk, *_ in result.rows) == sorted(went_dead)
        for row in InboxMessage.objects.all():
            entry = assert_replayed(
                row, went_dead[row.pk], reason="bug fixed in 1.2.3", via="test", by="bob"
            )
            assert entry["by"] == "bob"
        drain()

    assert effect_counts() == dict.fromkeys(ids, 1)
    rows = list(InboxMessage.objects.all())
    assert {row.status for row in rows} == {Status.COMPLETED}
    assert {row.attempts for row in rows} == {1}, "attempts started again from zero"
    assert all([e["kind"] for e in row.history] == ["error"] * 3 + ["replay"] for row in rows)


@transactional
def test_replay_after_the_missing_handler_is_deployed() -> None:
    """No handler: stored dead with the advice to replay once one exists. Follow it."""
    assert store(consumer="effects", message_id="late-1", event_type="replay.late", payload={})
    row = InboxMessage.objects.get(message_id="late-1")
    assert row.status == Status.DEAD

    def late(message: InboxMessage) -> None:
        Effect.objects.create(consumer="effects", message_id=message.message_id, attempt=0, pid=0)

    with handler("replay.late", "effects", late):
        result = replay(select(message_ids=["late-1"]), actor="carol", via="test")
        assert result.changed == {"dead": 1}
        assert_replayed(InboxMessage.objects.get(pk=row.pk), row, reason="", via="test", by="carol")
        drain()

    assert effect_counts() == {"late-1": 1}
    assert InboxMessage.objects.get(pk=row.pk).status == Status.COMPLETED


# --- completed rows: refused unless forced, with a reason, and allowed by the policy -------


@pytest.mark.django_db
def test_forced_replay_is_refused_when_the_consumer_forbids_it() -> None:
    (done,) = make_rows(Status.COMPLETED, 1, prefix="locked")
    (other,) = make_rows(Status.COMPLETED, 1, prefix="free", consumer="stream")
    unchanged = snapshot([done.pk, other.pk])
    consumers = {
        **settings.INBOX_CONSUMERS,
        "effects": {**settings.INBOX_CONSUMERS["effects"], "allow_replay_completed": False},
    }
    with override_settings(INBOX_CONSUMERS=consumers):
        result = replay(
            select(pks=[done.pk], statuses=["completed"]),
            actor="dave",
            reason="please",
            force=True,
            via="test",
        )
        assert result.total == 0
        assert result.refused == {
            "completed, and consumer 'effects' sets allow_replay_completed=False": 1
        }
        assert snapshot([done.pk, other.pk]) == unchanged

        code, out = replay_command(
            "--id", str(done.pk), "--status", "completed", "--force", "--reason", "please"
        )
        assert code == 1, out
        assert "allow_replay_completed=False" in out
        assert snapshot([done.pk, other.pk]) == unchanged

        # The policy is per consumer: the other consumer's completed row may be forced.
        result = replay(
            select(statuses=["completed"]), actor="dave", reason="please", force=True, via="test"
        )
        assert result.changed == {"completed": 1}
        assert [pk for pk, *_ in result.rows] == [other.pk]
    assert snapshot([done.pk]) == {done.pk: unchanged[done.pk]}
    assert InboxMessage.objects.get(pk=other.pk).status == Status.RECEIVED


@pytest.mark.django_db
def test_global_setting_forbids_forced_replays_too() -> None:
    (done,) = make_rows(Status.COMPLETED, 1)
    with override_settings(INBOX_ALLOW_REPLAY_COMPLETED=False):
        result = replay(select(pks=[done.pk]), actor="x", reason="y", force=True, via="test")
    assert result.total == 0 and sum(result.refused.values()) == 1
    assert InboxMessage.objects.get(pk=done.pk).status == Status.COMPLETED


# --- selection -----------------------------------------------------------------------------


def replayed_ids() -> set[str]:
    return set(
        InboxMessage.objects.filter(status=Status.RECEIVED).values_list("message_id", flat=True)
    )


@pytest.mark.django_db
def test_select_by_id_and_message_id() -> None:
    rows = make_rows(Status.DEAD, 4, prefix="d")

    code, out = replay_command("--id", str(rows[1].pk))
    assert code == 0, out
    assert replayed_ids() == {"d-1"}

    code, out = replay_command("--id", str(rows[2].pk), "--id", str(rows[3].pk))
    assert code == 0, out
    assert replayed_ids() == {"d-1", "d-2", "d-3"}

    code, out = replay_command("--message-id", "d-0", "--message-id", "no-such-id")
    assert code == 0, out
    assert replayed_ids() == {"d-0", "d-1", "d-2", "d-3"}
    assert all(len(entries(row, "replay")) == 1 for row in InboxMessage.objects.all())


@pytest.mark.django_db
def test_select_by_consumer_and_event_type() -> None:
    make_rows(Status.DEAD, 2, prefix="eff", consumer="effects")
    make_rows(Status.DEAD, 2, prefix="str", consumer="stream")
    make_rows(Status.DEAD, 1, prefix="other-type", consumer="stream", event_type="thing.else")

    code, out = replay_command("--consumer", "stream", "--event-type", "effect.write")
    assert code == 0, out
    assert replayed_ids() == {"str-0", "str-1"}

    code, out = replay_command("--event-type", "thing.else")
    assert code == 0, out
    assert replayed_ids() == {"str-0", "str-1", "other-type-0"}

    code, out = replay_command("--consumer", "effects")
    assert code == 0, out
    assert replayed_ids() == {"str-0", "str-1", "other-type-0", "eff-0", "eff-1"}


@pytest.mark.django_db
def test_default_statuses_are_dead_and_parked_and_status_narrows() -> None:
    make_rows(Status.DEAD, 2, prefix="dead")
    make_rows(Status.PARKED, 2, prefix="parked")
    done = make_rows(Status.COMPLETED, 1, prefix="done")
    untouchable = [
        *make_rows(Status.RECEIVED, 1, prefix="recv"),
        *make_rows(Status.IN_PROGRESS, 1, prefix="busy"),
        *make_rows(Status.FAILED, 1, prefix="failed"),
    ]
    unchanged = snapshot([row.pk for row in [*done, *untouchable]])

    code, out = replay_command("--status", "parked")
    assert code == 0, out
    assert "replayed 2 row(s) (parked 2)" in out
    assert replayed_ids() == {"recv-0", "parked-0", "parked-1"}

    code, out = replay_command("--all")
    assert code == 0, out
    assert "replayed 2 row(s) (dead 2)" in out
    assert replayed_ids() == {"recv-0", "parked-0", "parked-1", "dead-0", "dead-1"}
    assert snapshot([row.pk for row in [*done, *untouchable]]) == unchanged


@pytest.mark.django_db
def test_select_by_time_iso_and_ago() -> None:
    make_rows(Status.DEAD, 1, prefix="5h", ago=timedelta(hours=5))
    make_rows(Status.DEAD, 1, prefix="1h", ago=timedelta(hours=1))
    make_rows(Status.DEAD, 1, prefix="now")
    now = timezone.now()

    # Dry runs first: which rows each window selects.
    def would(*args: str) -> set[str]:
        code, out = replay_command("--dry-run", *args)
        assert code == 0, out
        return {line.split()[2] for line in out.splitlines() if line.endswith("(dead)")}

    assert would("--since", "2h") == {"1h-0", "now-0"}
    assert would("--until", "2h") == {"5h-0"}
    assert would("--since", "6h", "--until", "30m") == {"5h-0", "1h-0"}
    iso_from = (now - timedelta(hours=3)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    iso_to = (now - timedelta(minutes=30)).isoformat()
    assert would("--since", iso_from, "--until", iso_to) == {"1h-0"}, "naive ISO means UTC"
    # An ISO time with another offset names the same instant.
    plus_two = (now - timedelta(hours=3)).astimezone(timezone.get_fixed_timezone(120))
    assert would("--since", plus_two.isoformat()) == {"1h-0", "now-0"}
    assert replayed_ids() == set(), "dry runs changed nothing"

    # A date alone is midnight UTC.
    tomorrow = (now + timedelta(days=1)).astimezone(UTC).date().isoformat()
    assert would("--until", tomorrow) == {"5h-0", "1h-0", "now-0"}
    assert would("--since", tomorrow) == set()

    code, out = replay_command("--since", iso_from, "--until", iso_to)
    assert code == 0, out
    assert replayed_ids() == {"1h-0"}


@pytest.mark.django_db
def test_a_bare_replay_is_refused_and_the_count_is_shown_before_acting() -> None:
    make_rows(Status.DEAD, 2, prefix="bare")
    make_rows(Status.PARKED, 1, prefix="bare-parked")
    before = snapshot([row.pk for row in InboxMessage.objects.all()])

    code, out = replay_command("--reason", "all of it")

    assert code == 2, out
    assert "say what to replay" in out and "--all" in out
    assert snapshot([row.pk for row in InboxMessage.objects.all()]) == before

    code, out = replay_command("--all")

    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "Selected 3 row(s) (dead 2, parked 1)", lines
    assert lines[-1] == "inbox_replay: replayed 3 row(s) (dead 2, parked 1)"


@pytest.mark.django_db
def test_dry_run_lists_rows_and_changes_nothing() -> None:
    rows = make_rows(Status.DEAD, 3, prefix="dry")
    parked = make_rows(Status.PARKED, 1, prefix="dry-parked")
    pks = [row.pk for row in [*rows, *parked]]
    unchanged = snapshot(pks)

    code, out = replay_command("--all", "--dry-run", "--reason", "just looking")

    assert code == 0, out
    assert snapshot(pks) == unchanged
    for row in rows:
        assert f"{row.pk} effects {row.message_id} (dead)" in out
    assert f"{parked[0].pk} effects dry-parked-0 (parked)" in out
    assert "would replay 4 row(s) (dead 3, parked 1)" in out

    result = replay(select(statuses=["dead"]), actor="x", dry_run=True, via="test")
    assert result.dry_run and result.changed == {"dead": 3}
    assert snapshot(pks) == unchanged


@pytest.mark.django_db
def test_an_empty_list_selects_nothing() -> None:
    """``select(pks=[])`` (an admin or task with nothing selected) must not mean "every row"."""
    make_rows(Status.DEAD, 3, prefix="keep")
    empties: list[dict[str, Any]] = [
        {"pks": []},
        {"message_ids": []},
        {"event_types": []},
        {"statuses": []},
    ]
    for empty in empties:
        result = replay(select(**empty), actor="x", via="test")
        assert (result.total, dict(result.refused)) == (0, {}), empty
    assert replayed_ids() == set()
    assert select().count() == 3, "None (the default) still means any"


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_dry_run_locks_nothing_so_a_real_replay_at_the_same_time_misses_nothing() -> None:
    from django.db import connections

    rows = make_rows(Status.DEAD, 5, prefix="dry-lock")
    locked: list[int] = []
    gate, done = threading.Event(), threading.Event()

    def slow_dry_run() -> None:
        # Holds the dry run's batch transaction open while the real replay runs.
        try:
            from django.db import transaction

            with transaction.atomic():
                locked.append(replay(select(), actor="look", dry_run=True, via="test").total)
                gate.set()
                done.wait(timeout=30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow_dry_run)
    thread.start()
    try:
        assert gate.wait(timeout=30)
        result = replay(select(), actor="do", via="test")
    finally:
        done.set()
        thread.join(timeout=30)
    assert locked == [5]
    assert result.total == 5, "rows a dry run looked at were not skipped as locked"
    assert replayed_ids() == {row.message_id for row in rows}


@pytest.mark.django_db
def test_rows_still_being_processed_are_never_replayed() -> None:
    rows = [
        *make_rows(Status.RECEIVED, 2, prefix="recv"),
        *make_rows(Status.IN_PROGRESS, 2, prefix="busy"),
        *make_rows(Status.FAILED, 2, prefix="failed"),
    ]
    pks = [row.pk for row in rows]
    unchanged = snapshot(pks)

    # Whatever the selection, and even forced: refused, each status named.
    result = replay(select(pks=pks), actor="x", reason="y", force=True, via="test")

    assert result.total == 0
    assert result.refused == {
        "received (cannot replay from received)": 2,
        "in_progress (cannot replay from in_progress)": 2,
        "failed (cannot replay from failed)": 2,
    }
    assert snapshot(pks) == unchanged
    # The command does not select them at all.
    code, out = replay_command(*[arg for pk in pks for arg in ("--id", str(pk))])
    assert code == 0, out
    assert "replayed 0 row(s)" in out
    assert snapshot(pks) == unchanged


# --- concurrency ---------------------------------------------------------------------------


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_interleaved_replays_in_small_batches_replay_each_row_once() -> None:
    """Four threads (own connections) replaying the same 500 rows 7 at a time, interleaved:
    their batches skip each other's locked rows, and rows another one already replayed."""
    from django.db import connections

    make_rows(Status.DEAD, 500, prefix="threads")
    barrier = threading.Barrier(4)
    results: list[Any] = []
    errors: list[BaseException] = []

    def operator(n: int) -> None:
        try:
            barrier.wait(timeout=30)
            results.append(
                replay(
                    select(statuses=["dead", "parked"]),
                    actor=f"thread {n}",
                    via="test",
                    batch_size=7,
                    keep=1000,
                )
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=operator, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []

    totals = [result.total for result in results]
    print(f"four interleaved replays (batches of 7) over 500 dead rows: {totals}")
    assert sum(totals) == 500
    listed = [pk for result in results for pk, *_ in result.rows]
    assert len(listed) == len(set(listed)) == 500
    rows = list(InboxMessage.objects.all())
    assert {row.status for row in rows} == {Status.RECEIVED}
    assert [len(entries(row, "replay")) for row in rows] == [1] * 500
    by = [entries(row, "replay")[0]["by"] for row in rows]
    assert sorted(by.count(f"thread {n}") for n in range(4)) == sorted(totals)


# --- park and retry now --------------------------------------------------------------------


@pytest.mark.django_db
def test_park_sets_rows_aside_from_received_failed_and_dead() -> None:
    parkable = [
        *make_rows(Status.RECEIVED, 2, prefix="recv"),
        *make_rows(Status.FAILED, 1, prefix="failed", attempts=2),
        *make_rows(Status.DEAD, 1, prefix="dead"),
    ]
    refused = [
        *make_rows(Status.IN_PROGRESS, 1, prefix="busy"),
        *make_rows(Status.COMPLETED, 1, prefix="done"),
        *make_rows(Status.PARKED, 1, prefix="parked"),
    ]
    unchanged = snapshot([row.pk for row in refused])
    before = {row.pk: row for row in parkable}

    result = park(
        select(pks=[row.pk for row in [*parkable, *refused]]),
        actor="frank",
        reason="poison, investigating",
        via="admin",
    )

    assert result.changed == {"received": 2, "failed": 1, "dead": 1}
    assert result.refused == {
        "in_progress (cannot park from in_progress)": 1,
        "completed (cannot park from completed)": 1,
        "parked (cannot park from parked)": 1,
    }
    assert snapshot([row.pk for row in refused]) == unchanged
    for row in InboxMessage.objects.filter(pk__in=before):
        old = before[row.pk]
        assert (row.status, row.next_attempt_at, row.attempts) == (
            Status.PARKED,
            None,
            old.attempts,
        )
        assert row.history[:-1] == old.history
        entry = row.history[-1]
        assert {k: entry[k] for k in ("kind", "by", "via", "reason", "from", "attempts")} == {
            "kind": "park",
            "by": "frank",
            "via": "admin",
            "reason": "poison, investigating",
            "from": old.status,
            "attempts": old.attempts,
        }
    # No worker takes a parked row.
    assert process_due().handled == 0
    assert InboxMessage.objects.filter(status=Status.PARKED).count() == 5


@pytest.mark.django_db
def test_retry_now_makes_failed_rows_due_keeping_their_attempts() -> None:
    later = timezone.now() + timedelta(hours=1)
    (failed,) = make_rows(Status.FAILED, 1, prefix="failed", attempts=2, next_attempt_at=later)
    others = [
        *make_rows(Status.RECEIVED, 1, prefix="recv", next_attempt_at=later),
        *make_rows(Status.IN_PROGRESS, 1, prefix="busy"),
        *make_rows(Status.COMPLETED, 1, prefix="done"),
        *make_rows(Status.DEAD, 1, prefix="dead"),
        *make_rows(Status.PARKED, 1, prefix="parked"),
    ]
    unchanged = snapshot([row.pk for row in others])
    assert process_due().handled == 0, "not due yet"

    result = retry_now(
        select(pks=[row.pk for row in [failed, *others]]), actor="gina", reason="", via="test"
    )

    assert result.changed == {"failed": 1}
    assert sum(result.refused.values()) == 5
    assert {why.split()[0] for why in result.refused} == {
        "received",
        "in_progress",
        "completed",
        "dead",
        "parked",
    }
    assert snapshot([row.pk for row in others]) == unchanged
    row = InboxMessage.objects.get(pk=failed.pk)
    assert row.status == Status.FAILED and row.attempts == 2
    assert row.next_attempt_at is not None and row.next_attempt_at <= timezone.now()
    assert row.history[:-1] == failed.history
    entry = row.history[-1]
    assert (entry["kind"], entry["by"], entry["from"], entry["attempts"]) == (
        "retry",
        "gina",
        "failed",
        2,
    )

    # It is due now: a worker runs its third attempt at once.
    assert process_due().handled == 1
    row = InboxMessage.objects.get(pk=failed.pk)
    assert (row.status, row.attempts) == (Status.COMPLETED, 3)
    assert effect_counts() == {"failed-0": 1}


# --- bulk ----------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_replay_10000_dead_rows_in_one_call() -> None:
    make_rows(Status.DEAD, 10_000, prefix="bulk")
    started = time.monotonic()

    result = replay(
        select(statuses=["dead", "parked"]), actor="ops", reason="bulk replay", via="test"
    )

    took = time.monotonic() - started
    print(f"replay of 10,000 dead rows in one call: {took:.2f}s")
    assert result.total == 10_000 and result.changed == {"dead": 10_000}
    assert len(result.rows) == 100, "only the first `keep` rows are listed"
    statuses = set(InboxMessage.objects.values_list("status", flat=True))
    assert statuses == {Status.RECEIVED}
    replays = [
        sum(1 for entry in entries_ if entry["kind"] == "replay")
        for entries_ in InboxMessage.objects.values_list("history", flat=True)
    ]
    assert len(replays) == 10_000 and set(replays) == {1}
    assert not InboxMessage.objects.exclude(attempts=0).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["K" * 300, "nul\x00key"])
def test_a_message_kept_dead_without_its_key_is_not_replayed_in_an_ordered_consumer(
    key: str,
) -> None:
    """Its key could not be stored as it arrived, so it was blanked (cut or cleaned, two keys
    could have become one): replayed, it would run as an unkeyed message, outside the order
    of the key it named. In a consumer that does not order by key, the key does not matter."""
    from django_inbox.intake.storing import store_dead

    for consumer, message_id in (("ordered", "lost-ordered"), ("effects", "lost-plain")):
        store_dead(
            consumer=consumer, message_id=message_id, event_type="ordered.apply", payload={},
            key=key, sequence=3, reason="key cannot be stored", error_type="InvalidField",
        )  # fmt: skip
    rows = {row.message_id: row for row in InboxMessage.objects.all()}
    assert {row.key for row in rows.values()} == {""}
    assert all(row.last_error.startswith("KeyLost: ") for row in rows.values())

    result = replay(select(statuses=["dead"]), actor="dave", reason="retry", via="test")

    assert result.refused == {
        "kept dead without the key it named (unreadable, or too long to store): replayed, it "
        "would run outside its key's order; skip it": 1
    }
    assert result.changed == {"dead": 1}
    assert [message_id for _, _, message_id, _ in result.rows] == ["lost-plain"]
