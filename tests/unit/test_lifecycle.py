"""The row's life (``django_inbox.lifecycle``) walked: every transition an operator, a worker's
claim or purge makes is tried from every status, on the database the suite runs on, and done
exactly from the statuses the table names, reaching only the statuses it names. The table is
also checked against the code that names its statuses elsewhere and against the places it says
each transition is written."""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_inbox import lifecycle
from django_inbox.lifecycle import DELETED, TRANSITIONS
from django_inbox.models import POLLED_STATUSES, InboxMessage
from django_inbox.processing.claims import claim_batch
from django_inbox.services import park, purge, replay, retry_now, skip

Status = InboxMessage.Status
STATUSES = tuple(Status)
CONSUMER = "effects"  # a plain consumer with a handler for effect.write
db = pytest.mark.django_db(transaction=True)
NEVER_DUE = (Status.COMPLETED, Status.SKIPPED, Status.DEAD, Status.PARKED)


def make(status: str) -> InboxMessage:
    """A row of ``status`` as the inbox leaves it, old enough for any retention, due if it
    is ever due (an ``in_progress`` one with its lease expired)."""
    long_ago = timezone.now() - timedelta(days=400)
    done = status in (Status.COMPLETED, Status.SKIPPED)
    return InboxMessage.objects.create(
        consumer=CONSUMER,
        message_id=f"walk-{status}-{uuid.uuid4().hex[:8]}",
        event_type="effect.write",
        payload={},
        status=status,
        attempts={Status.RECEIVED: 0, Status.WAITING: 0}.get(status, 1),
        next_attempt_at=None if status in NEVER_DUE else long_ago,
        locked_until=long_ago if status == Status.IN_PROGRESS else None,
        lease_id=f"L-{uuid.uuid4().hex}" if status == Status.IN_PROGRESS else "",
        processed_at=long_ago if done else None,
        received_at=long_ago,
        updated_at=long_ago,
    )


def after(row: InboxMessage) -> str:
    found = InboxMessage.objects.filter(pk=row.pk).values_list("status", flat=True).first()
    return DELETED if found is None else found


def one(row: InboxMessage) -> Any:
    return InboxMessage.objects.filter(pk=row.pk)


#: Each action, and the transitions it makes (a forced replay re-runs completed rows too).
ACTIONS: dict[str, tuple[Callable[[InboxMessage], Any], tuple[str, ...]]] = {
    "replay": (lambda row: replay(one(row), actor="walk"), ("replay",)),
    "replay --force": (lambda row: replay(one(row), force=True, actor="walk"), ("replay", "rerun")),
    "park": (lambda row: park(one(row), actor="walk"), ("park",)),
    "retry_now": (lambda row: retry_now(one(row), actor="walk"), ("retry_now",)),
}


@db
@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("name", list(ACTIONS))
def test_an_operators_action_changes_a_row_exactly_from_the_statuses_of_its_transition(
    name: str, status: str
) -> None:
    action, names = ACTIONS[name]
    row = make(status)
    with override_settings(INBOX_ALLOW_REPLAY_COMPLETED=True):
        result = action(row)
    allowed = [TRANSITIONS[n] for n in names if TRANSITIONS[n].allows(status)]
    if allowed:
        assert sum(result.changed.values()) == 1, result
        assert any(after(row) in transition.targets for transition in allowed)
    else:
        assert sum(result.changed.values()) == 0, result
        assert after(row) == status


@db
@pytest.mark.parametrize("status", STATUSES)
def test_a_skip_is_refused_from_the_statuses_its_transition_does_not_name(status: str) -> None:
    row = make(status)  # of a plain consumer: refused either way, but for a different reason
    result = skip(one(row), actor="walk")
    assert sum(result.changed.values()) == 0 and after(row) == status
    refused_for_status = any("cannot skip from" in reason for reason in result.refused)
    assert refused_for_status is not TRANSITIONS["skip"].allows(status), result.refused


@db
@pytest.mark.parametrize("status", STATUSES)
def test_purge_deletes_exactly_from_the_statuses_of_its_transition(status: str) -> None:
    row = make(status)
    if not TRANSITIONS["purge"].allows(status):
        with pytest.raises(ValueError, match="can be purged"):
            purge(statuses=(status,), older_than=0)
        assert after(row) == status
        return
    result = purge(statuses=(status,), older_than=0)
    assert result.deleted[status] == 1, result
    assert after(row) == DELETED


@db
def test_a_claim_takes_exactly_the_statuses_of_its_transition() -> None:
    rows = {status: make(status) for status in STATUSES}
    claimed = {message.status_before for message in _claim_all()}  # type: ignore[attr-defined]
    assert claimed == set(TRANSITIONS["claim"].sources)
    for status, row in rows.items():
        if TRANSITIONS["claim"].allows(status):
            assert after(row) in TRANSITIONS["claim"].targets
        else:
            assert after(row) == status


def _claim_all() -> list[InboxMessage]:
    before = dict(InboxMessage.objects.values_list("pk", "status"))
    claimed = claim_batch(CONSUMER, 100)
    for message in claimed:
        message.status_before = before[message.pk]  # type: ignore[attr-defined]
    return claimed


def test_the_statuses_the_code_names_are_the_tables() -> None:
    from django_inbox.services import PURGEABLE, operator

    assert set(operator.REPLAYABLE) == set(TRANSITIONS["replay"].sources)
    assert set(operator.PARKABLE) == set(TRANSITIONS["park"].sources)
    assert set(operator.RETRYABLE) == set(TRANSITIONS["retry_now"].sources)
    assert set(operator.SKIPPABLE) == set(TRANSITIONS["skip"].sources)
    assert set(PURGEABLE) == set(TRANSITIONS["purge"].sources)
    assert set(POLLED_STATUSES) == set(TRANSITIONS["claim"].sources)


def test_every_status_is_reached_and_every_transition_is_written_where_it_says() -> None:
    reached = {target for t in TRANSITIONS.values() for target in t.targets}
    assert set(STATUSES) <= reached
    for transition in TRANSITIONS.values():
        assert transition.sources and transition.targets and transition.where
        if Status.IN_PROGRESS in transition.sources and transition.name != "claim":
            assert set(lifecycle.LEASE_CLEARED) <= set(transition.writes), transition.name
        for where in transition.where:
            assert callable(_resolve(where)), where


def _resolve(where: str) -> object:
    """``module.function`` or ``module.Class.method`` under ``django_inbox``."""
    parts = where.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found: object = importlib.import_module("django_inbox." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name, None)
        return found
    return None
