"""The helpers users get for testing their own handlers (django_inbox.testing), proved against
the test project's real handlers and against deliberately non-idempotent ones, in
``transaction=True`` tests (everything commits), plain ``django_db`` tests and a Django
``TestCase`` (the test's transaction wraps everything)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import TestCase
from effects.models import Effect
from shop.models import Payment, Stock

from django_inbox import Outcome, deliver, store
from django_inbox.models import InboxMessage
from django_inbox.registry import registry
from django_inbox.testing import (
    Inbox,
    SimulatedCrash,
    check_exactly_once,
    crash_after_handler,
    deliver_times,
    deliver_twice,
    run_worker,
    simulate_crash,
)
from tests.conftest import handler
from tests.effects import effect_counts

# How users load the fixtures; here in the test module, as tests/conftest.py is shared.
pytest_plugins = ["django_inbox.testing"]

Status = InboxMessage.Status
CONSUMER = "testing-helpers"
transactional = pytest.mark.django_db(transaction=True)


def effect(message_id: str, **payload: Any) -> dict[str, Any]:
    """A message for the test project's ``effects`` handler (one Effect row per commit)."""
    return {
        "consumer": "effects",
        "message_id": message_id,
        "event_type": "effect.write",
        "payload": payload,
    }


def order(consumer: str, message_id: str, **payload: Any) -> dict[str, Any]:
    """An ``order.placed`` message for the shop's ``inventory`` or ``payments`` handler."""
    return {
        "consumer": consumer,
        "message_id": message_id,
        "event_type": "order.placed",
        "payload": payload,
    }


def row(consumer: str, message_id: str) -> InboxMessage:
    return InboxMessage.objects.get(consumer=consumer, message_id=message_id)


def attempts_of_effects(message_id: str) -> list[int]:
    """The attempt number of every committed effect of a message, in order."""
    return list(
        Effect.objects.filter(consumer="effects", message_id=message_id)
        .order_by("pk")
        .values_list("attempt", flat=True)
    )


# --- Non-idempotent handlers: each has a side effect outside the inbox's transaction. ---


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture
def file_writing_handler(tmp_path: Path) -> Iterator[Path]:
    """Registers a handler that appends a line to a file: a write no rollback can undo."""
    ledger = tmp_path / "ledger.txt"

    def append_line(message: InboxMessage) -> None:
        with ledger.open("a") as out:
            out.write(f"{message.message_id} attempt {message.attempts}\n")

    with handler("ledger.append", CONSUMER, append_line):
        yield ledger


@pytest.fixture
def file_writing_on_commit_handler(tmp_path: Path) -> Iterator[Path]:
    """The same write, deferred with ``transaction.on_commit``: the safe version."""
    ledger = tmp_path / "ledger-on-commit.txt"

    def append_line_on_commit(message: InboxMessage) -> None:
        def write() -> None:
            with ledger.open("a") as out:
                out.write(f"{message.message_id} attempt {message.attempts}\n")

        transaction.on_commit(write)

    with handler("ledger.append_on_commit", CONSUMER, append_line_on_commit):
        yield ledger


def ledger_message(message_id: str, event_type: str = "ledger.append") -> dict[str, Any]:
    return {"consumer": CONSUMER, "message_id": message_id, "event_type": event_type, "payload": {}}


# --- deliver_twice / deliver_times ---


@transactional
def test_deliver_twice_reserves_stock_once() -> None:
    Stock.objects.create(sku="A1", qty=10)

    outcomes = deliver_twice(**order("inventory", "evt-1", sku="A1", qty=3))

    assert outcomes == (Outcome.PROCESSED, Outcome.DUPLICATE)
    assert Stock.objects.get(sku="A1").qty == 7
    assert (row("inventory", "evt-1").status, row("inventory", "evt-1").attempts) == (
        Status.COMPLETED,
        1,
    )


@transactional
def test_deliver_times_runs_the_handler_once() -> None:
    outcomes = deliver_times(4, **effect("evt-1"))

    assert outcomes == [Outcome.PROCESSED] + [Outcome.DUPLICATE] * 3
    assert effect_counts() == {"evt-1": 1}


@transactional
@pytest.mark.parametrize("n", [0, -1, True, 1.5])
def test_deliver_times_refuses_a_bad_count(n: Any) -> None:
    with pytest.raises(ValueError, match="positive integer"):
        deliver_times(n, **effect("evt-1"))
    assert not InboxMessage.objects.exists()


# --- simulate_crash ---


@transactional
def test_simulate_crash_applies_the_effect_once_and_counts_the_lost_attempt() -> None:
    seen_after_crash: list[tuple[int, int]] = []

    def look() -> None:
        seen_after_crash.append((Effect.objects.count(), InboxMessage.objects.count()))

    outcome = simulate_crash(**effect("evt-1"), after_crash=look)

    assert outcome == Outcome.PROCESSED
    assert seen_after_crash == [(0, 0)], "the crashed attempt must leave nothing, not even a row"
    message = row("effects", "evt-1")
    assert (message.status, message.attempts) == (Status.COMPLETED, 2)
    assert [e["type"] for e in message.errors] == ["LostAttempt"]
    assert attempts_of_effects("evt-1") == [2], "only the redelivery's attempt committed"
    assert deliver(**effect("evt-1")) == Outcome.DUPLICATE
    assert effect_counts() == {"evt-1": 1}


@transactional
def test_simulate_crash_on_the_shop_reserves_stock_once() -> None:
    Stock.objects.create(sku="A1", qty=10)

    assert simulate_crash(**order("inventory", "evt-1", sku="A1", qty=3)) == Outcome.PROCESSED

    assert Stock.objects.get(sku="A1").qty == 7
    assert row("inventory", "evt-1").attempts == 2


@transactional
def test_simulate_crash_reports_what_the_redelivery_made_of_a_failure() -> None:
    # effects: max_attempts 3. The crashed attempt counts as attempt 1, the redelivery is 2.
    assert simulate_crash(**effect("evt-r", reject="bad order")) == Outcome.DEAD
    assert simulate_crash(**effect("evt-p", park="ask a human")) == Outcome.PARKED
    assert simulate_crash(**effect("evt-f", fail_always=True)) == Outcome.FAILED

    assert [e["type"] for e in row("effects", "evt-r").errors] == ["LostAttempt", "Reject"]
    assert [e["type"] for e in row("effects", "evt-p").errors] == ["LostAttempt", "Park"]
    failed = row("effects", "evt-f")
    assert (failed.status, failed.attempts) == (Status.FAILED, 2)
    assert [e["type"] for e in failed.errors] == ["LostAttempt", "RuntimeError"]
    assert not Effect.objects.exists(), "failed attempts roll their effects back"


@transactional
def test_a_flaky_gateway_is_charged_once_after_a_crash() -> None:
    # The first attempt times out (and the process dies); attempt 2 charges.
    message = order("payments", "evt-1", order_id="o-1", amount_cents=500, gateway_failures=1)

    assert simulate_crash(**message) == Outcome.PROCESSED

    payment = Payment.objects.get()
    assert payment.idempotency_key == row("payments", "evt-1").idempotency_key


@transactional
def test_simulate_crash_needs_a_new_message() -> None:
    assert deliver(**effect("evt-1")) == Outcome.PROCESSED

    with pytest.raises(AssertionError, match="has not seen"):
        simulate_crash(**effect("evt-1"))

    assert effect_counts() == {"evt-1": 1}
    assert row("effects", "evt-1").attempts == 1


@transactional
def test_simulate_crash_needs_a_handler() -> None:
    with pytest.raises(LookupError, match="no handler"):
        simulate_crash(**order("nobody", "evt-1"))
    assert not InboxMessage.objects.exists()


@transactional
def test_the_crash_is_undone_when_the_block_ends() -> None:
    original = registry.get("effects", "effect.write")
    assert original is not None

    with pytest.raises(RuntimeError), crash_after_handler("effects", "effect.write", times=2):
        assert registry.get("effects", "effect.write") != original
        raise RuntimeError("the test failed inside the block")

    assert registry.get("effects", "effect.write") == original
    assert deliver(**effect("evt-1")) == Outcome.PROCESSED
    with (
        pytest.raises(ValueError, match="positive integer"),
        crash_after_handler("effects", "effect.write", times=0),
    ):
        pass


@transactional
def test_crash_after_handler_crashes_the_given_number_of_calls() -> None:
    with crash_after_handler("effects", "effect.write", times=2) as plan:
        for message_id in ("evt-1", "evt-2"):
            with pytest.raises(SimulatedCrash):
                deliver(**effect(message_id))
        assert deliver(**effect("evt-3")) == Outcome.PROCESSED
    assert (plan.crashes, plan.remaining) == (2, 0)
    assert list(InboxMessage.objects.values_list("message_id", flat=True)) == ["evt-3"]
    assert effect_counts() == {"evt-3": 1}


# --- The helper-based check catches non-idempotent handlers ---


@transactional
def test_check_exactly_once_passes_for_the_shop_handlers() -> None:
    Stock.objects.create(sku="A1", qty=10)

    def stock() -> int:
        return Stock.objects.get(sku="A1").qty

    assert check_exactly_once(stock, **order("inventory", "evt-1", sku="A1", qty=3)) == 7
    assert (
        check_exactly_once(
            Payment.objects.count, **order("payments", "evt-1", order_id="o-1", amount_cents=500)
        )
        == 1
    )


@transactional
def test_check_exactly_once_catches_a_handler_that_writes_a_file(
    file_writing_handler: Path,
) -> None:
    with pytest.raises(AssertionError, match="left an effect behind"):
        check_exactly_once(lambda: lines(file_writing_handler), **ledger_message("evt-1"))
    assert lines(file_writing_handler) == 1, "the crashed attempt's line stayed"


@transactional
def test_simulate_crash_shows_the_file_write_doubled(file_writing_handler: Path) -> None:
    # Without the check: the redelivery succeeds, and the effect happened twice.
    assert simulate_crash(**ledger_message("evt-1")) == Outcome.PROCESSED
    assert file_writing_handler.read_text().splitlines() == ["evt-1 attempt 1", "evt-1 attempt 2"]
    # deliver_twice alone cannot see it: the duplicate never runs the handler.
    assert deliver_twice(**ledger_message("evt-2")) == (Outcome.PROCESSED, Outcome.DUPLICATE)
    assert lines(file_writing_handler) == 3


@transactional
def test_check_exactly_once_passes_for_the_same_write_deferred_to_on_commit(
    file_writing_on_commit_handler: Path,
) -> None:
    message = ledger_message("evt-1", "ledger.append_on_commit")

    assert check_exactly_once(lambda: lines(file_writing_on_commit_handler), **message) == 1
    assert file_writing_on_commit_handler.read_text() == "evt-1 attempt 2\n"


@pytest.mark.server_db
@transactional
def test_check_exactly_once_catches_a_handler_that_commits_on_its_own_connection() -> None:
    """A handler that writes through a second database connection, as a call to another
    service that commits would: the write survives the crash."""
    database = connection.settings_dict["NAME"]

    def write_elsewhere(message: InboxMessage) -> None:
        other = connections.create_connection("default")
        try:
            assert other.settings_dict["NAME"] == database, "must write to the test database"
            with other.cursor() as cursor:  # autocommit: committed at once
                cursor.execute(
                    "INSERT INTO effects_effect (consumer, message_id, attempt, pid, rerun) "
                    "VALUES (%s, %s, %s, %s, false)",
                    ["elsewhere", message.message_id, message.attempts, os.getpid()],
                )
        finally:
            other.close()

    def committed_elsewhere() -> int:
        return Effect.objects.filter(consumer="elsewhere").count()

    with handler("elsewhere.write", CONSUMER, write_elsewhere):
        message = {**ledger_message("evt-1"), "event_type": "elsewhere.write"}
        with pytest.raises(AssertionError, match="left an effect behind"):
            check_exactly_once(committed_elsewhere, **message)

    assert list(Effect.objects.filter(consumer="elsewhere").values_list("attempt", flat=True)) == [
        1
    ]


@transactional
def test_check_exactly_once_refuses_an_effect_the_handler_does_not_change() -> None:
    with pytest.raises(AssertionError, match="did not change the effect"):
        check_exactly_once(Stock.objects.count, **effect("evt-1"))


@transactional
def test_check_exactly_once_fails_when_the_redelivery_is_not_processed() -> None:
    with pytest.raises(AssertionError, match="returned dead, not processed"):
        check_exactly_once(Effect.objects.count, **effect("evt-1", reject="no"))


# --- run_worker ---


@transactional
def test_run_worker_processes_stored_messages() -> None:
    for n in range(3):
        assert store(**effect(f"evt-{n}"))

    assert run_worker(["effects"]) == {Outcome.PROCESSED: 3}
    assert effect_counts() == {"evt-0": 1, "evt-1": 1, "evt-2": 1}
    assert run_worker(["effects"]) == {}


@transactional
def test_a_failure_is_recorded_then_retried_when_made_due() -> None:
    calls: list[int] = []

    def flaky(message: InboxMessage) -> None:
        calls.append(message.attempts)
        Effect.objects.create(consumer=CONSUMER, message_id=message.message_id, attempt=0, pid=0)
        if message.attempts == 1:
            raise ConnectionError("downstream is down")

    # A backoff of an hour: without due_now the retry is certainly not due.
    with handler("flaky", CONSUMER, flaky, backoff_base=3600.0, backoff_max=3600.0):
        message = {**ledger_message("evt-1"), "event_type": "flaky"}
        assert deliver(**message) == Outcome.FAILED
        failed = row(CONSUMER, "evt-1")
        assert (failed.status, failed.attempts) == (Status.FAILED, 1)
        assert [e["type"] for e in failed.errors] == ["ConnectionError"]
        assert not Effect.objects.exists(), "the failed attempt's write rolled back"

        assert run_worker([CONSUMER]) == {}, "the retry waits for its backoff"
        assert deliver(**message) == Outcome.FAILED, "so does a redelivery"
        assert run_worker([CONSUMER], due_now=True) == {Outcome.PROCESSED: 1}

    done = row(CONSUMER, "evt-1")
    assert (done.status, done.attempts) == (Status.COMPLETED, 2)
    assert calls == [1, 2]
    assert Effect.objects.count() == 1


@transactional
def test_settle_retries_until_the_message_goes_dead() -> None:
    assert deliver(**effect("evt-1", fail_always=True)) == Outcome.FAILED

    # effects: max_attempts 3: attempt 2 fails, attempt 3 goes dead.
    assert run_worker(["effects"], settle=True) == {Outcome.FAILED: 1, Outcome.DEAD: 1}

    dead = row("effects", "evt-1")
    assert (dead.status, dead.attempts) == (Status.DEAD, 3)
    assert [e["type"] for e in dead.errors] == ["RuntimeError"] * 3
    assert not Effect.objects.exists()


@transactional
def test_settle_finishes_a_flaky_payment() -> None:
    message = order("payments", "evt-1", order_id="o-1", amount_cents=500, gateway_failures=2)
    assert deliver(**message) == Outcome.FAILED

    assert run_worker(["payments"], settle=True) == {Outcome.FAILED: 1, Outcome.PROCESSED: 1}

    assert row("payments", "evt-1").attempts == 3
    assert Payment.objects.count() == 1


@transactional
def test_reject_and_park_outcomes_leave_no_effect() -> None:
    Stock.objects.create(sku="A1", qty=10)

    assert deliver(**order("inventory", "evt-1", sku="A1", qty=0)) == Outcome.DEAD
    assert deliver(**effect("evt-2", park="check the address")) == Outcome.PARKED
    assert run_worker(settle=True) == {}, "dead and parked messages are not retried"

    assert row("inventory", "evt-1").last_error == "Reject: quantity must be positive"
    assert row("effects", "evt-2").status == Status.PARKED
    assert Stock.objects.get(sku="A1").qty == 10
    assert not Effect.objects.exists()


@transactional
def test_a_worker_crash_is_taken_over_once_the_lease_ends() -> None:
    assert store(**effect("evt-1"))

    with crash_after_handler("effects", "effect.write"), pytest.raises(SimulatedCrash):
        run_worker(["effects"])

    claimed = row("effects", "evt-1")
    assert (claimed.status, claimed.attempts) == (Status.IN_PROGRESS, 1)
    assert not Effect.objects.exists()
    assert run_worker(["effects"]) == {}, "the dead worker's lease still holds the message"
    assert deliver(**effect("evt-1"), redelivered=True) == Outcome.IN_PROGRESS

    assert run_worker(["effects"], expire_leases=True) == {Outcome.PROCESSED: 1}

    done = row("effects", "evt-1")
    assert (done.status, done.attempts) == (Status.COMPLETED, 2)
    assert [e["type"] for e in done.errors] == ["LeaseExpired"]
    assert attempts_of_effects("evt-1") == [2]


# --- The fixture ---


@transactional
def test_the_inbox_fixture_in_a_transactional_test(inbox: Inbox) -> None:
    Stock.objects.create(sku="A1", qty=10)

    assert inbox.deliver_twice(**order("inventory", "evt-1", sku="A1", qty=1)) == (
        Outcome.PROCESSED,
        Outcome.DUPLICATE,
    )
    assert inbox.simulate_crash(**order("inventory", "evt-2", sku="A1", qty=2)) == (
        Outcome.PROCESSED
    )
    assert inbox.errors("inventory", "evt-2") == ["LostAttempt"]
    assert inbox.store(**effect("evt-3"))
    assert inbox.run_worker() == {Outcome.PROCESSED: 1}
    assert inbox.row("effects", "evt-3").status == Status.COMPLETED
    assert Stock.objects.get(sku="A1").qty == 7


def test_the_inbox_fixture_in_a_test_transaction(inbox: Inbox) -> None:
    """No mark: the fixture asks for ``db``, so the test runs in one rolled-back transaction
    (the inbox's transactions are savepoints) and the helpers still behave."""
    assert transaction.get_connection().in_atomic_block
    Stock.objects.create(sku="A1", qty=10)

    assert (
        inbox.check_exactly_once(
            lambda: Stock.objects.get(sku="A1").qty, **order("inventory", "evt-1", sku="A1", qty=4)
        )
        == 6
    )
    assert inbox.deliver(**effect("evt-2", fail_times=1)) == Outcome.FAILED
    assert inbox.run_worker(["effects"], due_now=True) == {Outcome.PROCESSED: 1}
    assert attempts_of_effects("evt-2") == [2]


# --- Django TestCase: everything inside the test's transaction ---


class HelpersInATestCase(TestCase):
    """In a ``TestCase`` the inbox's transactions are savepoints: a crash rolls back to its
    savepoint, and ``on_commit`` callbacks (and the inbox's signals) only run when captured."""

    def setUp(self) -> None:
        Stock.objects.create(sku="A1", qty=10)

    def test_deliver_twice_and_simulate_crash(self) -> None:
        assert deliver_twice(**order("inventory", "evt-1", sku="A1", qty=3)) == (
            Outcome.PROCESSED,
            Outcome.DUPLICATE,
        )
        assert simulate_crash(**order("inventory", "evt-2", sku="A1", qty=2)) == (Outcome.PROCESSED)
        assert Stock.objects.get(sku="A1").qty == 5
        message = row("inventory", "evt-2")
        assert message.attempts == 2
        assert [e["type"] for e in message.errors] == ["LostAttempt"]

    def test_check_exactly_once_and_run_worker(self) -> None:
        assert (
            check_exactly_once(
                Payment.objects.count,
                **order("payments", "evt-1", order_id="o-1", amount_cents=500),
            )
            == 1
        )
        assert deliver(**effect("evt-2", fail_always=True)) == Outcome.FAILED
        assert run_worker(["effects"], settle=True) == {Outcome.FAILED: 1, Outcome.DEAD: 1}
        assert row("effects", "evt-2").status == Status.DEAD

    def test_a_worker_crash_and_its_take_over(self) -> None:
        assert store(**effect("evt-1"))
        with crash_after_handler("effects", "effect.write"), pytest.raises(SimulatedCrash):
            run_worker(["effects"])
        assert row("effects", "evt-1").status == Status.IN_PROGRESS
        assert run_worker(["effects"]) == {}

        assert run_worker(["effects"], expire_leases=True) == {Outcome.PROCESSED: 1}
        assert [e["type"] for e in row("effects", "evt-1").errors] == ["LeaseExpired"]
        assert attempts_of_effects("evt-1") == [2]

    def test_check_exactly_once_catches_the_file_write(self) -> None:
        ledger = Path(self.enterContext(_tmpdir())) / "ledger.txt"

        def append_line(message: InboxMessage) -> None:
            with ledger.open("a") as out:
                out.write(f"{message.message_id}\n")

        with (
            handler("ledger.append", CONSUMER, append_line),
            self.assertRaisesRegex(AssertionError, "left an effect behind"),
        ):
            check_exactly_once(lambda: lines(ledger), **ledger_message("evt-1"))
        assert lines(ledger) == 1

    def test_on_commit_work_of_the_crashed_attempt_is_discarded(self) -> None:
        sent: list[int] = []

        def notify(message: InboxMessage) -> None:
            attempt = message.attempts
            transaction.on_commit(lambda: sent.append(attempt))

        with handler("notify", CONSUMER, notify):
            message = {**ledger_message("evt-1"), "event_type": "notify"}
            with self.captureOnCommitCallbacks(execute=True) as callbacks:
                assert simulate_crash(**message) == Outcome.PROCESSED
            assert sent == [2], "only the redelivery's callback runs"
            # Without capturing, nothing commits in a TestCase: the callback never runs.
            assert deliver(**{**message, "message_id": "evt-2"}) == Outcome.PROCESSED
        assert sent == [2]
        assert len(callbacks) >= 1


def _tmpdir() -> Any:
    import tempfile

    return tempfile.TemporaryDirectory()
