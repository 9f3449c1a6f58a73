"""``django_inbox.models``: the row, its key, its queryset helpers and its constraint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from django_inbox.models import POLLED_STATUSES, InboxMessage

Status = InboxMessage.Status


def message(consumer: str = "inventory", message_id: str = "evt-1") -> InboxMessage:
    return InboxMessage(consumer=consumer, message_id=message_id, event_type="order.placed")


# --- idempotency_key -------------------------------------------------------------------------


def test_idempotency_key_is_stable() -> None:
    key = message().idempotency_key
    assert message().idempotency_key == key
    # Attempts, status and payload do not change it.
    other = message()
    other.attempts, other.status, other.payload = 5, Status.FAILED, {"x": 1}
    assert other.idempotency_key == key


def test_idempotency_key_is_pinned_across_releases() -> None:
    # External providers remember keys: a changed derivation would charge a replay twice.
    assert (
        message("payments", "order-42").idempotency_key
        == "inbox-d46fa5bbe73ddbcba2e292d81402200a0e0266b21c323f5ae5d24842250e1ba9"
    )


def test_idempotency_key_differs_per_consumer_and_per_message() -> None:
    keys = {
        message("inventory", "evt-1").idempotency_key,
        message("payments", "evt-1").idempotency_key,
        message("inventory", "evt-2").idempotency_key,
        # No ambiguity where consumer and id meet.
        message("ab", "c").idempotency_key,
        message("a", "bc").idempotency_key,
    }
    assert len(keys) == 5


@pytest.mark.parametrize(
    ("consumer", "message_id"),
    [("c", "1"), ("x" * 100, "y" * 255), ("ünï", "😀-id"), ("a", "line\nbreak")],
)
def test_idempotency_key_is_short_ascii(consumer: str, message_id: str) -> None:
    key = message(consumer, message_id).idempotency_key
    assert len(key) <= 70
    assert key.isascii()
    assert key.isprintable()
    assert " " not in key


# --- errors ----------------------------------------------------------------------------------


def test_errors_filters_history() -> None:
    row = message()
    row.history = [
        {"kind": "error", "attempt": 1, "message": "boom"},
        {"kind": "replay", "by": "admin"},
        {"kind": "error", "attempt": 2, "message": "boom again"},
        {"kind": "park", "by": "admin"},
        {"attempt": 3},
    ]
    assert [e["attempt"] for e in row.errors] == [1, 2]
    assert all(e["kind"] == "error" for e in row.errors)


def test_errors_of_new_row_is_empty() -> None:
    assert message().errors == []
    assert message().history == []


# --- model metadata --------------------------------------------------------------------------


def test_named_unique_constraint() -> None:
    constraints = {c.name: c for c in InboxMessage._meta.constraints}
    constraint = constraints["django_inbox_unique_consumer_message"]
    assert isinstance(constraint, models.UniqueConstraint)
    assert tuple(constraint.fields) == ("consumer", "message_id")
    assert constraint.condition is None


def test_statuses() -> None:
    assert [s.value for s in Status] == [
        "received",
        "in_progress",
        "completed",
        "failed",
        "dead",
        "parked",
        "waiting",
        "skipped",
    ]
    assert Status.RECEIVED == "received"
    assert message().status == Status.RECEIVED
    assert message().attempts == 0


def test_str() -> None:
    assert str(message("inventory", "evt-9")) == "inventory:evt-9 (received)"


def test_contract_fields_exist() -> None:
    names = {f.name for f in InboxMessage._meta.get_fields()}
    assert {
        "consumer",
        "message_id",
        "source",
        "event_type",
        "key",
        "payload",
        "headers",
        "status",
        "attempts",
        "last_error",
        "history",
        "received_at",
        "updated_at",
        "next_attempt_at",
        "locked_until",
        "processed_at",
    } <= names


def test_custom_permissions() -> None:
    codenames = {codename for codename, _ in InboxMessage._meta.permissions}
    assert {"replay_inboxmessage", "park_inboxmessage", "retry_inboxmessage"} <= codenames


# --- database --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_unique_constraint_is_enforced() -> None:
    InboxMessage.objects.create(consumer="inventory", message_id="evt-1", payload={})
    InboxMessage.objects.create(consumer="payments", message_id="evt-1", payload={})
    with pytest.raises(IntegrityError), transaction.atomic():
        InboxMessage.objects.create(consumer="inventory", message_id="evt-1", payload={})
    assert InboxMessage.objects.count() == 2


@pytest.fixture
def rows(db):  # type: ignore[no-untyped-def]
    now = timezone.now()
    past, future = now - timedelta(minutes=5), now + timedelta(minutes=5)
    specs = {
        "new": (Status.RECEIVED, past, None),
        "new-unscheduled": (Status.RECEIVED, None, None),
        "retry-due": (Status.FAILED, past, None),
        "retry-later": (Status.FAILED, future, None),
        "running": (Status.IN_PROGRESS, future, future),
        "abandoned": (Status.IN_PROGRESS, past, past),
        "done": (Status.COMPLETED, past, None),
        "dead": (Status.DEAD, past, None),
        "parked": (Status.PARKED, past, None),
    }
    for name, (status, next_attempt_at, locked_until) in specs.items():
        InboxMessage.objects.create(
            consumer="inventory",
            message_id=name,
            event_type="order.placed",
            payload={},
            status=status,
            next_attempt_at=next_attempt_at,
            locked_until=locked_until,
        )
    InboxMessage.objects.create(
        consumer="payments",
        message_id="other-consumer",
        event_type="order.placed",
        payload={},
        next_attempt_at=past,
    )
    return now


def ids(queryset) -> set[str]:  # type: ignore[no-untyped-def]
    return set(queryset.values_list("message_id", flat=True))


def test_polled_statuses() -> None:
    assert set(POLLED_STATUSES) == {"received", "failed", "in_progress"}


def test_due(rows) -> None:  # type: ignore[no-untyped-def]
    due = InboxMessage.objects.for_consumer("inventory").due(rows)
    assert ids(due) == {"new", "retry-due", "abandoned"}
    assert ids(InboxMessage.objects.due(rows)) == {
        "new",
        "retry-due",
        "abandoned",
        "other-consumer",
    }
    # Later, the rows scheduled in the future are due as well.
    later = rows + timedelta(minutes=10)
    assert ids(InboxMessage.objects.for_consumer("inventory").due(later)) == {
        "new",
        "retry-due",
        "retry-later",
        "running",
        "abandoned",
    }
    # Without an explicit time, "now" is used.
    assert ids(InboxMessage.objects.for_consumer("inventory").due()) == ids(due)


def test_pending(rows) -> None:  # type: ignore[no-untyped-def]
    assert ids(InboxMessage.objects.for_consumer("inventory").pending()) == {
        "new",
        "new-unscheduled",
        "retry-due",
        "retry-later",
        "running",
        "abandoned",
    }


def test_stale(rows) -> None:  # type: ignore[no-untyped-def]
    assert ids(InboxMessage.objects.stale(rows)) == {"abandoned"}
    assert ids(InboxMessage.objects.stale()) == {"abandoned"}
    assert ids(InboxMessage.objects.stale(rows + timedelta(minutes=10))) == {
        "running",
        "abandoned",
    }


def test_status_helpers(rows) -> None:  # type: ignore[no-untyped-def]
    objects = InboxMessage.objects
    assert ids(objects.completed()) == {"done"}
    assert ids(objects.failed()) == {"retry-due", "retry-later"}
    assert ids(objects.dead()) == {"dead"}
    assert ids(objects.parked()) == {"parked"}
    assert ids(objects.for_consumer("payments")) == {"other-consumer"}
    assert objects.for_consumer(None).count() == 10


@pytest.mark.django_db
def test_json_fields_round_trip() -> None:
    payload = {"sku": "A1", "qty": 5, "tags": ["ü", "😀"], "nested": {"n": None}}
    row = InboxMessage.objects.create(
        consumer="inventory",
        message_id="evt-json",
        event_type="order.placed",
        payload=payload,
        headers={"ce-id": "1"},
        history=[
            {"kind": "error", "attempt": 1, "at": "2026-01-01T00:00:00+00:00"},
            {"kind": "error", "attempt": 2},
        ],
    )
    row.refresh_from_db()
    assert row.payload == payload
    assert row.headers == {"ce-id": "1"}
    # a whole entry comes back as it was; one without a time reads with a blank one
    assert row.errors == [
        {"kind": "error", "attempt": 1, "at": "2026-01-01T00:00:00+00:00"},
        {"kind": "error", "attempt": 2, "at": ""},
    ]
