"""``django_inbox.processing.leases``: every change of a claimed row is fenced on its lease (a
row another claim holds now is left alone), and every change out of ``in_progress`` clears the
lease (``lifecycle.LEASE_CLEARED``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_inbox import history, lifecycle, store
from django_inbox.models import InboxMessage
from django_inbox.processing import leases
from django_inbox.processing.claims import claim_batch

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
CONSUMER = "effects"


def claimed(message_id: str = "lease-1", *, times: int = 1) -> InboxMessage:
    """A stored row claimed ``times`` times (its attempts count them)."""
    store(consumer=CONSUMER, message_id=message_id, event_type="effect.write", payload={})
    row = None
    for _ in range(times):
        if row is not None:  # due again, as after a failure
            InboxMessage.objects.filter(pk=row.pk).update(
                status=Status.FAILED,
                lease_id="",
                locked_until=None,
                next_attempt_at=timezone.now(),
            )
        [row] = claim_batch(CONSUMER, 1, message_id=message_id)
    assert row is not None
    return row


def fresh(row: InboxMessage) -> InboxMessage:
    return InboxMessage.objects.get(pk=row.pk)


def entry() -> dict[str, Any]:
    return history.error_entry(
        None,
        attempt=1,
        at=timezone.now(),
        outcome=Status.FAILED,
        error_type="RuntimeError",
        message="down",
    )


CHANGES: dict[str, Callable[[InboxMessage], object]] = {
    "complete": lambda row: leases.complete(row, timezone.now(), "default"),
    "complete_all": lambda row: leases.complete_all([row], "default"),
    "fail": lambda row: leases.fail(
        row, Status.FAILED, entry(), timezone.now(), timezone.now(), "default"
    ),
    "release": lambda row: leases.release(row, timezone.now(), "default"),
    "set_aside": lambda row: leases.set_aside(row, Status.WAITING, {}, timezone.now(), "default"),
    "release_interrupted": lambda row: leases.release_interrupted(row, entry(), "default"),
    "abandoned": lambda row: leases.abandoned(
        row, entry(), Status.FAILED, timezone.now(), timezone.now(), "default"
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_out_of_in_progress_clears_the_lease(change: str) -> None:
    row = claimed()
    assert CHANGES[change](row)
    after = fresh(row)
    assert after.status != Status.IN_PROGRESS
    assert after.lease_id == "" and after.locked_until is None
    assert set(lifecycle.LEASE_CLEARED) == {"locked_until", "lease_id"}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_is_fenced_on_the_lease_and_leaves_another_claims_row_alone(change: str) -> None:
    row = claimed()
    InboxMessage.objects.filter(pk=row.pk).update(lease_id="another-claim")
    before = fresh(row)
    assert not CHANGES[change](row)
    after = fresh(row)
    assert (after.status, after.lease_id, after.attempts, after.history) == (
        before.status,
        before.lease_id,
        before.attempts,
        before.history,
    )


def test_a_completion_writes_the_completed_row() -> None:
    row = claimed()
    now = timezone.now()
    assert leases.complete(row, now, "default")
    after = fresh(row)
    assert after.status == Status.COMPLETED and after.processed_at is not None
    assert after.next_attempt_at is None and after.last_error == "" and after.attempts == 1


@pytest.mark.parametrize(("times", "status"), [(1, Status.RECEIVED), (3, Status.FAILED)])
def test_a_row_given_back_unstarted_is_due_at_once_with_its_attempt_uncounted(
    times: int, status: str
) -> None:
    row = claimed(times=times)
    assert row.attempts == times
    now = timezone.now()
    assert leases.release(row, now, "default") == 1
    after = fresh(row)
    assert (after.status, after.attempts, after.next_attempt_at) == (status, times - 1, now)


def test_a_row_given_back_for_later_is_due_then() -> None:
    row = claimed()
    now = timezone.now()
    later = now + timedelta(seconds=5)
    leases.release(row, now, "default", due=later)
    assert fresh(row).next_attempt_at == later


def test_giving_back_never_counts_attempts_below_zero() -> None:
    row = claimed()
    InboxMessage.objects.filter(pk=row.pk).update(attempts=0)  # written by hand
    leases.release(row, timezone.now(), "default")
    assert fresh(row).attempts == 0


def test_a_claims_lost_reply_gives_back_every_row_of_its_lease() -> None:
    first, second = claimed("lease-a"), claimed("lease-b", times=2)
    InboxMessage.objects.filter(pk=second.pk).update(lease_id=first.lease_id)
    assert leases.release_lease(first.lease_id, timezone.now(), "default") == 2
    assert {(r.status, r.attempts, r.lease_id) for r in InboxMessage.objects.all()} == {
        (Status.RECEIVED, 0, ""),
        (Status.FAILED, 1, ""),
    }


def test_a_dead_workers_row_taken_over_keeps_its_claim_and_gains_an_entry() -> None:
    row = claimed()
    assert leases.abandoned(row, entry(), Status.IN_PROGRESS, None, timezone.now(), "default")
    after = fresh(row)
    assert after.status == Status.IN_PROGRESS and after.lease_id == row.lease_id
    assert [e["kind"] for e in after.history][-1] == "error"
