"""deliver(): inline processing with real commits."""

from __future__ import annotations

import time

import pytest
from django.db import DatabaseError, connection, transaction
from effects.models import Effect

from django_inbox import Outcome, deliver, store
from django_inbox.models import InboxMessage
from django_inbox.processing.attempts import process_claimed
from django_inbox.processing.claims import claim_batch
from django_inbox.processing.worker import Worker
from tests.effects import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


def send(message_id: str, consumer: str = "effects", **payload: object) -> Outcome:
    return deliver(
        consumer=consumer, message_id=message_id, event_type="effect.write", payload=payload
    )


def row(message_id: str, consumer: str = "effects") -> InboxMessage:
    return InboxMessage.objects.get(consumer=consumer, message_id=message_id)


def test_duplicate_after_success_applies_the_effect_once() -> None:
    outcomes = [send("evt-1") for _ in range(5)]

    assert outcomes == [Outcome.PROCESSED] + [Outcome.DUPLICATE] * 4
    assert effect_counts() == {"evt-1": 1}
    message = row("evt-1")
    assert message.status == Status.COMPLETED
    assert message.attempts == 1
    assert message.processed_at is not None


def test_handler_failure_rolls_back_and_records_then_retry_completes() -> None:
    assert send("evt-2", fail_times=1) == Outcome.FAILED

    message = row("evt-2")
    assert message.status == Status.FAILED
    assert message.attempts == 1
    assert "planned failure on attempt 1" in message.last_error
    assert [e["attempt"] for e in message.errors] == [1]
    assert message.errors[0]["type"] == "RuntimeError"
    assert "Traceback" in message.errors[0]["traceback"]
    assert message.next_attempt_at is not None
    assert Effect.objects.count() == 0, "the failed attempt's write must be rolled back"

    stats = Worker(["effects"], until_idle=1, poll_interval=0.02).run()

    assert stats.outcomes == {"processed": 1}
    message.refresh_from_db()
    assert message.status == Status.COMPLETED
    assert message.attempts == 2
    assert list(Effect.objects.values_list("message_id", "attempt")) == [("evt-2", 2)]


def test_failed_message_not_yet_due_is_reported_without_running() -> None:
    assert send("evt-3", fail_times=5) == Outcome.FAILED
    InboxMessage.objects.filter(pk=row("evt-3").pk).update(
        next_attempt_at=row("evt-3").received_at.replace(year=2999)
    )

    assert send("evt-3", fail_times=5) == Outcome.FAILED
    assert row("evt-3").attempts == 1


def test_exhausted_attempts_go_dead_with_history() -> None:
    assert send("evt-4", fail_times=99) == Outcome.FAILED
    stats = Worker(["effects"], until_idle=1, poll_interval=0.02).run()

    message = row("evt-4")
    assert stats.outcomes == {"failed": 1, "dead": 1}
    assert message.status == Status.DEAD
    assert message.attempts == 3  # INBOX_CONSUMERS["effects"]["max_attempts"]
    assert [e["attempt"] for e in message.errors] == [1, 2, 3]
    assert [e["outcome"] for e in message.errors] == ["failed", "failed", "dead"]
    assert Effect.objects.count() == 0


def test_reject_is_dead_at_once_and_park_is_parked() -> None:
    assert send("evt-5", reject="not for us") == Outcome.DEAD
    assert send("evt-6", park="needs a human") == Outcome.PARKED

    assert row("evt-5").status == Status.DEAD
    assert row("evt-5").last_error == "Reject: not for us"
    assert row("evt-6").status == Status.PARKED
    assert row("evt-6").last_error == "Park: needs a human"
    assert Effect.objects.count() == 0
    # Neither is retried by a worker.
    assert Worker(["effects"], until_idle=0).run().handled == 0
    assert send("evt-5") == Outcome.DEAD
    assert send("evt-6") == Outcome.PARKED


def test_message_held_by_a_worker_is_in_progress() -> None:
    assert store(consumer="effects", message_id="evt-7", event_type="effect.write", payload={})
    (claimed,) = claim_batch("effects", 10)

    assert send("evt-7") == Outcome.IN_PROGRESS
    assert Effect.objects.count() == 0
    assert claimed.status == Status.IN_PROGRESS


def test_deliver_processes_a_stored_message() -> None:
    assert store(consumer="effects", message_id="evt-8", event_type="effect.write", payload={})
    assert not store(consumer="effects", message_id="evt-8", event_type="effect.write", payload={})

    assert send("evt-8") == Outcome.PROCESSED
    assert send("evt-8") == Outcome.DUPLICATE
    assert effect_counts() == {"evt-8": 1}
    assert row("evt-8").attempts == 1


def test_deliver_inside_a_rolled_back_transaction_leaves_nothing() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        assert send("evt-9") == Outcome.PROCESSED
        raise RuntimeError("the caller's transaction fails")

    assert not InboxMessage.objects.exists()
    assert not Effect.objects.exists()
    assert send("evt-9") == Outcome.PROCESSED


def test_handler_sees_the_message_row() -> None:
    seen: list[InboxMessage] = []

    from tests.conftest import handler

    with handler("probe", "probe", seen.append):
        deliver(
            consumer="probe",
            message_id="m-1",
            event_type="probe",
            payload={"a": [1, 2]},
            headers={"h": "v"},
            source="orders",
            key="order-7",
        )
    (message,) = seen
    assert message.pk == row("m-1", "probe").pk
    assert (message.payload, message.headers, message.source, message.key) == (
        {"a": [1, 2]},
        {"h": "v"},
        "orders",
        "order-7",
    )
    assert message.attempts == 1
    assert message.idempotency_key == row("m-1", "probe").idempotency_key


def test_retry_delays_follow_the_policy() -> None:
    before = time.time()
    assert send("evt-10", fail_times=1) == Outcome.FAILED
    message = row("evt-10")
    delay = message.next_attempt_at.timestamp() - before
    # effects: backoff_base 0.01s, first retry within [0, 0.01s] plus the call's own time.
    assert -0.001 <= delay <= 0.5


def _swallow_database_error(message: InboxMessage) -> None:
    Effect.objects.create(consumer="probe", message_id=message.message_id, attempt=1, pid=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 / 0")
    except DatabaseError:
        pass  # the mistake: no savepoint, so PostgreSQL has aborted the transaction


def _mark_for_rollback(message: InboxMessage) -> None:
    Effect.objects.create(consumer="probe", message_id=message.message_id, attempt=1, pid=0)
    transaction.set_rollback(True)


@pytest.mark.parametrize(
    "func",
    [
        pytest.param(_swallow_database_error, marks=pytest.mark.postgres, id="swallowed-error"),
        pytest.param(_mark_for_rollback, id="set-rollback"),
    ],
)
@pytest.mark.parametrize("path", ["deliver", "worker"])
def test_handler_leaving_an_aborted_transaction_fails_instead_of_vanishing(
    func: object, path: str
) -> None:
    from tests.conftest import handler

    with handler("fragile", "probe", func, max_attempts=5):  # type: ignore[arg-type]
        if path == "deliver":
            outcome = deliver(consumer="probe", message_id="m-1", event_type="fragile", payload={})
        else:
            store(consumer="probe", message_id="m-1", event_type="fragile", payload={})
            outcome = process_claimed(claim_batch("probe", 1)[0])

    assert outcome == Outcome.FAILED
    message = row("m-1", "probe")
    assert message.status == Status.FAILED
    assert message.errors[-1]["type"] == "TransactionAborted"
    assert not Effect.objects.exists()


def test_completion_after_a_retry_clears_last_error_but_keeps_history() -> None:
    assert send("evt-11", fail_times=1) == Outcome.FAILED
    Worker(["effects"], until_idle=1, poll_interval=0.02).run()

    message = row("evt-11")
    assert message.status == Status.COMPLETED
    assert message.last_error == ""
    assert [e["attempt"] for e in message.errors] == [1]
