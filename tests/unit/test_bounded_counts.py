"""Counts that stay fast on large tables (``django_inbox.db.counting``, the tallies behind
``collect()``): exact up to a limit, the planner's estimate beyond it, and marked as such.

The limits are lowered here (10,000 and 1,000 in production) so that a few dozen rows stand
for a backlog of hundreds of thousands. Each test runs on every database of the suite: on
SQLite, which has no planner estimate, every count stays exact.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from django_inbox.db import counting
from django_inbox.models import InboxMessage
from django_inbox.services import collect, tally_by_status
from django_inbox.services import selection as selection_module
from django_inbox.services import stats as stats_module
from django_inbox.services import tallies as tallies_module
from tests.unit.test_services_stats import analyze, make_rows

Status = InboxMessage.Status
ESTIMATES = connection.vendor in ("postgresql", "mysql")

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A family counts as large above 20 rows; a consumer above 8."""
    monkeypatch.setattr(stats_module, "EXACT_UP_TO", 20)
    monkeypatch.setattr(tallies_module, "EXACT_PER_CONSUMER", 8)


def backlog() -> None:
    """``effects``: 40 received (the oldest received 2 h ago), 3 failed, 2 in progress (one
    past its lease), 30 dead; ``stream``: 5 received, 1 dead, 1 parked."""
    now = timezone.now()
    make_rows(Status.RECEIVED, 39, received_ago=timedelta(minutes=30))
    make_rows(
        Status.RECEIVED,
        1,
        prefix="oldest",
        received_ago=timedelta(hours=2),
        next_attempt_at=now - timedelta(hours=2),
    )
    make_rows(Status.FAILED, 3, next_attempt_at=now + timedelta(minutes=1))
    make_rows(Status.IN_PROGRESS, 1)
    make_rows(Status.IN_PROGRESS, 1, prefix="late", next_attempt_at=now - timedelta(minutes=1))
    make_rows(Status.DEAD, 30)
    make_rows(Status.RECEIVED, 5, consumer="stream")
    make_rows(Status.DEAD, 1, consumer="stream")
    make_rows(Status.PARKED, 1, consumer="stream")
    analyze()


def test_a_backlog_over_the_limit_is_estimated_and_marked_and_the_rest_stays_exact(
    small_limits: None,
) -> None:
    backlog()
    exact = collect(exact=True)
    found = collect()
    effects, stream = found.consumers["effects"], found.consumers["stream"]
    truth = exact.consumers["effects"]
    assert truth.counts[Status.RECEIVED] == 40 and truth.counts[Status.DEAD] == 30
    assert truth.estimated == set()

    # Failed and in-progress rows have their own indexes: exact however large the backlog.
    assert effects.counts[Status.FAILED] == 3
    assert effects.counts[Status.IN_PROGRESS] == 2
    assert effects.stuck == 1
    # A small consumer next to the large one stays exact.
    assert stream.counts[Status.RECEIVED] == 5
    assert stream.counts[Status.DEAD] == 1 and stream.counts[Status.PARKED] == 1
    assert stream.estimated == set()
    # Ages are exact: the samples read the rows in due order.
    assert effects.oldest_pending_age == pytest.approx(
        truth.oldest_pending_age, abs=(found.at - exact.at).total_seconds() + 1
    )
    assert effects.oldest_pending_received_at == truth.oldest_pending_received_at
    if ESTIMATES:
        assert effects.estimated == {Status.RECEIVED, Status.DEAD, Status.PARKED}
        # An estimate is never below what was read: more than the consumer's limit.
        assert effects.counts[Status.RECEIVED] > 8 - 5
        assert effects.counts[Status.DEAD] > 8
        # Freshly analysed, the planner is close (a small table: loosely).
        assert 20 <= effects.counts[Status.RECEIVED] <= 80
        assert 15 <= effects.counts[Status.DEAD] <= 60
    else:  # SQLite: no planner estimate, so it counts
        assert effects.estimated == set()
        assert effects.counts[Status.RECEIVED] == 40 and effects.counts[Status.DEAD] == 30

    report: dict[str, Any] = json.loads(json.dumps(found.as_dict(), default=str))
    assert report["consumers"]["effects"]["estimated"] == sorted(effects.estimated)
    assert report["consumers"]["stream"]["estimated"] == []

    from django_inbox.management.commands.inbox_stats import render

    table = render(found)
    if ESTIMATES:
        assert f"~{effects.counts[Status.RECEIVED]:,}" in table
        assert "the database's estimate, not a count of every row" in table
    assert "~" not in render(exact).replace("~ completed", "")


def test_exact_counts_every_row(small_limits: None) -> None:
    backlog()
    found = collect(exact=True)
    assert found.consumers["effects"].counts[Status.RECEIVED] == 40
    assert found.consumers["effects"].counts[Status.DEAD] == 30
    assert all(not consumer.estimated for consumer in found.consumers.values())


def test_under_the_limit_everything_is_exact_in_one_read_per_family() -> None:
    backlog()
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        found = collect()
    assert found.consumers["effects"].counts[Status.RECEIVED] == 40
    assert found.consumers["effects"].counts[Status.DEAD] == 30
    assert all(not consumer.estimated for consumer in found.consumers.values())
    table = InboxMessage._meta.db_table
    reads = [q["sql"] for q in captured.captured_queries if table in q["sql"]]
    # The rows to process, dead and parked, waiting: a bounded probe and one read each, the
    # held-up keys and the table's size. No per-consumer query.
    assert len(reads) <= 8, reads
    assert not any("UNION ALL" in sql for sql in reads)


def test_the_helpers_bound_what_they_read() -> None:
    make_rows(Status.DEAD, 25)
    make_rows(Status.DEAD, 3, consumer="stream")
    analyze()
    rows = InboxMessage.objects.filter(status=Status.DEAD)

    assert counting.bounded_count(rows, limit=10, guess=False) == (11, True)
    assert counting.bounded_count(rows, limit=100) == (28, False)
    count, estimated = counting.bounded_count(rows, limit=10)
    assert estimated is ESTIMATES and count >= 11
    assert not ESTIMATES or 14 <= count <= 56

    assert counting.bounded_counts(rows, ["effects", "stream", "nobody"], limit=10) == {
        "effects": 11,
        "stream": 3,
        "nobody": 0,
    }
    found = counting.sample(rows, ("consumer",), {"last": ("max", "updated_at")}, limit=100)
    assert found.complete and {g["consumer"]: g["n"] for g in found.groups} == {
        "effects": 25,
        "stream": 3,
    }
    assert all(g["last"].tzinfo is not None for g in found.groups)
    assert not counting.sample(rows, ("consumer",), limit=10).complete

    first = counting.firsts(rows, ["effects", "nobody"], ("message_id",), ("message_id",))
    assert first == {"effects": (min(r.message_id for r in rows.filter(consumer="effects")),)}
    guesses = counting.estimates(rows, ["effects", "stream"])
    if ESTIMATES:
        assert guesses["effects"] is not None and guesses["effects"] >= 1
    else:
        assert guesses == {"effects": None, "stream": None}


def test_select_all_confirmation_estimates_a_large_selection(
    monkeypatch: pytest.MonkeyPatch, admin_client: Client
) -> None:
    make_rows(Status.DEAD, 30)
    make_rows(Status.PARKED, 2)
    analyze()
    dead = InboxMessage.objects.filter(status__in=(Status.DEAD, Status.PARKED))
    assert tally_by_status(dead, limit=100) == ({"dead": 30, "parked": 2}, False)
    counts, estimated = tally_by_status(dead, limit=10)
    assert estimated is ESTIMATES
    assert counts["dead"] >= (11 if ESTIMATES else 30)

    monkeypatch.setattr(selection_module.counting, "EXACT_UP_TO", 10)
    pk = dead.values_list("pk", flat=True).first()
    response = admin_client.post(
        "/admin/django_inbox/inboxmessage/?status__exact=dead",
        {
            "action": "replay_messages",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(pk)],
        },
    )
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="inbox-eligible"' in page
    if ESTIMATES:
        assert "the counts are the database" in page and "~" in page
    else:
        assert "<strong>30</strong> selected" in page


def test_a_status_not_met_among_a_large_consumers_rows_raises_no_problem(
    small_limits: None,
) -> None:
    """30 parked rows and no dead one, over the limits: the planner never estimates fewer
    than one row, so estimating ``dead`` would report "~1 dead" and fail the health check."""
    make_rows(Status.PARKED, 30)
    analyze()
    found = collect()
    effects = found.consumers["effects"]
    assert effects.counts[Status.DEAD] == 0
    assert effects.counts[Status.PARKED] >= (9 if ESTIMATES else 30)
    assert not [problem for problem in found.problems if problem.kind == "dead"]
