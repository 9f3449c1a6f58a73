"""``django_inbox.processing.takeover``: a row whose worker died (its lease expired) is charged
one attempt, and ends ``dead`` once its attempts are used up; a claim taking it over keeps it
claimed, ``inbox_reclaim`` makes it ``failed`` and due after the backoff."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.processing import takeover
from django_inbox.processing.claims import claim_batch

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
CONSUMER = "payments"  # max_attempts 4, backoff 0.05 s doubling to 0.2 s


def abandoned(message_id: str, attempts: int) -> InboxMessage:
    """A row claimed by a worker that died: ``in_progress``, its lease expired."""
    store(consumer=CONSUMER, message_id=message_id, event_type="order.placed", payload={})
    [row] = claim_batch(CONSUMER, 1, message_id=message_id)
    past = timezone.now() - timedelta(seconds=1)
    InboxMessage.objects.filter(pk=row.pk).update(
        attempts=attempts, locked_until=past, next_attempt_at=past
    )
    return InboxMessage.objects.get(pk=row.pk)


@pytest.mark.parametrize(("attempts", "status"), [(1, Status.FAILED), (3, Status.FAILED)])
def test_a_dead_workers_row_with_attempts_left_fails_and_is_due_after_the_backoff(
    attempts: int, status: str
) -> None:
    row = abandoned("t-1", attempts)
    now = timezone.now()
    assert takeover.abandoned_status(row) == status
    assert takeover.record_abandoned_attempt(row, now, "default", retry_now=False) == status
    after = InboxMessage.objects.get(pk=row.pk)
    assert after.status == status and after.lease_id == "" and after.locked_until is None
    assert now <= after.next_attempt_at <= now + timedelta(seconds=0.2)
    assert after.history[-1]["type"] == "LeaseExpired"


def test_a_dead_workers_row_whose_attempts_are_used_up_is_dead() -> None:
    row = abandoned("t-4", 4)
    assert takeover.abandoned_status(row) == Status.DEAD
    assert takeover.record_abandoned_attempt(row, timezone.now(), "default", retry_now=True) == (
        Status.DEAD
    )
    after = InboxMessage.objects.get(pk=row.pk)
    assert after.status == Status.DEAD and after.next_attempt_at is None
    assert "giving up after 4 attempts" in after.last_error


def test_a_row_taken_over_by_a_claim_stays_claimed_with_the_attempt_recorded() -> None:
    row = abandoned("t-2", 2)
    now = timezone.now()
    status = takeover.record_abandoned_attempt(row, now, "default", retry_now=True)
    assert status == Status.IN_PROGRESS
    after = InboxMessage.objects.get(pk=row.pk)
    assert after.status == Status.IN_PROGRESS and after.lease_id == row.lease_id
    assert after.history[-1]["type"] == "LeaseExpired"


def test_a_row_another_claim_took_first_is_left_alone() -> None:
    row = abandoned("t-3", 1)
    InboxMessage.objects.filter(pk=row.pk).update(lease_id="the-other-claim")
    takeover.record_abandoned_attempt(row, timezone.now(), "default", retry_now=False)
    after = InboxMessage.objects.get(pk=row.pk)
    assert after.status == Status.IN_PROGRESS and after.lease_id == "the-other-claim"
    assert after.history == row.history


def test_the_next_claim_takes_a_dead_workers_row_over() -> None:
    row = abandoned("t-5", 1)
    [again] = claim_batch(CONSUMER, 1)
    assert again.pk == row.pk and again.lease_id != row.lease_id
    assert again.attempts == 2
    assert [e["type"] for e in again.history if e.get("kind") == "error"] == ["LeaseExpired"]
