"""``django_inbox.ordered.gaps``: an ordered version waiting for a sequence that never came is
parked after its consumer's ``gap_timeout``; a replay runs it past the gap, and never over a
version that arrived meanwhile. (Moved from ``test_ordering.py``, assertions unchanged.)"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from django_inbox import Outcome
from django_inbox.models import InboxMessage
from django_inbox.ordered.gaps import GAP_PREFIX, park_expired_gaps
from django_inbox.services import collect, operator, skipping
from django_inbox.services.reclaim import reclaim
from tests.unit.test_ordering import (
    CONSUMER,
    applied,
    drain,
    ordered_policy,
    row,
    runs,
    send,
)

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


def test_a_gap_past_its_timeout_is_parked_and_a_replay_runs_it_past_the_gap() -> None:
    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 4) == Outcome.WAITING
        time.sleep(0.1)
        assert reclaim().parked_gaps == 1

        parked = row("K-4")
        assert parked.status == Status.PARKED
        assert parked.last_error.startswith(GAP_PREFIX)
        assert "key 'K' is missing sequence 2 (applied: 1; this is 4)" in parked.last_error
        assert parked.history[-1]["kind"] == "gap"

        operator.replay(InboxMessage.objects.filter(message_id="K-4"), actor="bob")
        drain()

    done = row("K-4")
    assert done.status == Status.COMPLETED
    assert [entry["kind"] for entry in done.history] == ["gap", "replay", "past_gap"]
    assert "sequences 2 to 3 of key 'K' never arrived" in done.history[-1]["message"]
    assert runs("K") == [1, 4]
    assert applied("K") == 4
    assert send("K", 2) == Outcome.SKIPPED  # arrived too late: stale now


def test_a_replayed_gap_whose_missing_version_arrived_meanwhile_waits_for_it() -> None:
    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        send("K", 3)
        time.sleep(0.1)
        park_expired_gaps()
        assert send("K", 2, fail_times=1) == Outcome.FAILED  # arrived, but fails once
        later = timezone.now() + timedelta(seconds=0.5)  # its retry's backoff, made longer
        InboxMessage.objects.filter(message_id="K-2").update(next_attempt_at=later)

        operator.replay(InboxMessage.objects.filter(message_id="K-3"), actor="bob")
        drain()
        assert row("K-3").status == Status.WAITING  # not past 2: it exists now
        assert runs("K") == [1]

        time.sleep(0.6)
        drain()

    assert runs("K") == [1, 2, 3]
    assert "past_gap" not in [entry["kind"] for entry in row("K-3").history]


def test_replaying_parked_gaps_never_passes_over_a_version_that_arrived() -> None:
    """Versions 4 and 3 both parked for the missing 2 (4 parked before 3 arrived): replaying
    all of them runs 3 then 4; only 2 is passed over."""
    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 4) == Outcome.WAITING
        time.sleep(0.1)
        assert park_expired_gaps() == 1
        assert send("K", 3) == Outcome.WAITING
        time.sleep(0.1)
        assert park_expired_gaps() == 1

        operator.replay(InboxMessage.objects.filter(status="parked"), actor="bob")
        drain()

    assert runs("K") == [1, 3, 4]
    assert applied("K") == 4
    # 4 came first in the replay: it passed over 2 only, and 3 ran before it.
    passed = [e["message"] for e in row("K-4").history if e["kind"] == "past_gap"]
    assert len(passed) == 1 and "sequences 2 to 2 of key 'K' never arrived" in passed[0]
    assert not [e for e in row("K-3").history if e["kind"] == "past_gap"]


def test_a_version_behind_a_parked_gap_waits_for_it_without_a_deadline() -> None:
    """4 arrives first (a gap), then 3: only 3 is parked for the gap; 4 waits behind it with
    no deadline (no sweep looks at it again), and replaying 3 runs 3 then 4."""
    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 4) == Outcome.WAITING
        assert send("K", 3) == Outcome.WAITING
        assert row("K-3").next_attempt_at is not None  # the gap before 3: swept
        assert send("K", 5) == Outcome.WAITING
        assert row("K-5").next_attempt_at is None  # behind 4, which exists: never swept
        time.sleep(0.1)
        assert park_expired_gaps() == 1
        assert (row("K-3").status, row("K-4").status) == ("parked", "waiting")
        assert row("K-4").next_attempt_at is None

        operator.replay(InboxMessage.objects.filter(status="parked"), actor="bob")
        drain()

    assert runs("K") == [1, 3, 4, 5]
    assert applied("K") == 5


def test_a_gap_before_a_skipped_version_is_parked_not_held_for_ever() -> None:
    """A version skipped ahead of a gap that never fills is parked for the gap like any other
    (it was held for ever before, with no action that applied to it): it shows as a problem,
    and replaying it passes the gap and skips it, as the operator asked; 4 waits behind it."""
    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 3) == Outcome.WAITING
        skipping.skip(InboxMessage.objects.filter(message_id="K-3"), actor="a")
        assert send("K", 4) == Outcome.WAITING
        time.sleep(0.1)
        assert park_expired_gaps() == 1  # 3, for the missing 2; 4 waits behind 3

        assert row("K-3").status == Status.PARKED
        assert "an operator skipped it" in row("K-3").last_error
        assert (row("K-4").status, row("K-4").next_attempt_at) == (Status.WAITING, None)
        assert [p.kind for p in collect(consumer=CONSUMER).problems] == ["stalled"]

        operator.replay(InboxMessage.objects.filter(message_id="K-3"), actor="bob")
        drain()

    assert row("K-3").status == Status.SKIPPED
    assert runs("K") == [1, 4]
    assert applied("K") == 4
    assert not collect(consumer=CONSUMER).problems


def test_concurrent_sweeps_park_a_gap_once() -> None:
    from django_inbox.ordered import gaps

    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        send("K", 3)
        time.sleep(0.1)
        pk = row("K-3").pk
        now = timezone.now()
        assert gaps._look_at_waiting(pk, now, "default") == 1
        assert gaps._look_at_waiting(pk, now, "default") == 0
