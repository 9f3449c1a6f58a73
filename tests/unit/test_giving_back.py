"""``django_inbox.processing.giving_back``: claimed rows given back unrun. On a graceful stop
(``release``) each is due now with its attempt uncounted. After a lost database connection
(``give_back_interrupted``, from the notes of ``interruptions``) the rows that waited are given
back the same way, and the row that was running gets an ``interrupted`` entry, free for its
first ``max_attempts`` interruptions and a failed attempt (``ConnectionLost``) after that."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.processing import giving_back, interruptions
from django_inbox.processing.claims import claim_batch

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
CONSUMER = "payments"  # max_attempts 4
LOST = OperationalError("server closed the connection unexpectedly")


def batch(n: int) -> list[InboxMessage]:
    for i in range(n):
        store(consumer=CONSUMER, message_id=f"g-{i}", event_type="order.placed", payload={})
    return claim_batch(CONSUMER, n)


def statuses() -> list[tuple[str, int, str]]:
    rows = InboxMessage.objects.order_by("pk")
    return [(r.status, r.attempts, r.lease_id) for r in rows]


def test_a_graceful_stop_gives_back_unstarted_rows_uncounted() -> None:
    claimed = batch(3)
    assert giving_back.release(claimed[1:]) == 2
    assert statuses() == [
        (Status.IN_PROGRESS, 1, claimed[0].lease_id),
        (Status.RECEIVED, 0, ""),
        (Status.RECEIVED, 0, ""),
    ]


def test_nothing_noted_gives_back_nothing() -> None:
    batch(1)
    assert not interruptions.pending()
    assert giving_back.give_back_interrupted() == 0


def test_an_interrupted_batch_is_given_back_and_its_running_row_says_so() -> None:
    claimed = batch(3)
    interruptions.note(claimed, using="default", running=claimed[0], error=LOST)
    assert giving_back.give_back_interrupted() == 3
    assert statuses() == [(Status.RECEIVED, 0, "")] * 3
    running = InboxMessage.objects.get(pk=claimed[0].pk)
    assert running.history[-1]["kind"] == "interrupted"
    assert "server closed the connection" in running.history[-1]["message"]
    assert not interruptions.pending()


def test_interruptions_past_max_attempts_count_as_failed_attempts() -> None:
    [row] = batch(1)
    for _ in range(4):  # the free ones (max_attempts 4)
        interruptions.note([row], using="default", running=row, error=LOST)
        giving_back.give_back_interrupted()
        [row] = claim_batch(CONSUMER, 1)
    assert interruptions.free_interruptions(row) == 4
    interruptions.note([row], using="default", running=row, error=LOST)
    giving_back.give_back_interrupted()
    after = InboxMessage.objects.get(pk=row.pk)
    assert after.status == Status.FAILED and after.attempts == 1
    assert after.history[-1]["type"] == "ConnectionLost"
    assert "used up its free ones" in after.last_error


def test_a_row_another_worker_took_over_meanwhile_is_left_alone() -> None:
    [row] = batch(1)
    interruptions.note([row], using="default", running=row, error=LOST)
    InboxMessage.objects.filter(pk=row.pk).update(lease_id="another-worker")
    giving_back.give_back_interrupted()
    after = InboxMessage.objects.get(pk=row.pk)
    assert (after.status, after.lease_id, after.attempts) == (
        Status.IN_PROGRESS,
        "another-worker",
        1,
    )
