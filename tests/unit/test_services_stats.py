"""``inbox_stats`` and ``django_inbox.services.collect``: counts per consumer and status, and the
problems an operator alerts on (dead rows, stuck rows, due rows waiting too long).

The command's exit codes are checked on real processes: 0 healthy, 1 problems, 2 misconfigured.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from django_inbox.models import InboxMessage
from django_inbox.services import STATUSES, collect
from django_inbox.services import stats as stats_module

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]


def make_rows(
    status: str,
    n: int = 1,
    *,
    consumer: str = "effects",
    prefix: str | None = None,
    next_attempt_at: datetime | None = None,
    received_ago: timedelta = timedelta(0),
) -> list[InboxMessage]:
    """``n`` rows in ``status``. ``next_attempt_at`` defaults to what the status implies: now
    for received/failed (just arrived, due), a live lease for in_progress, none otherwise."""
    now = timezone.now()
    if next_attempt_at is None:
        if status in (Status.RECEIVED, Status.FAILED):
            next_attempt_at = now
        elif status == Status.IN_PROGRESS:
            next_attempt_at = now + timedelta(minutes=5)
    prefix = prefix or f"{consumer}-{status}-{next_attempt_at and next_attempt_at.timestamp()}"
    rows = [
        InboxMessage(
            consumer=consumer,
            message_id=f"{prefix}-{i}",
            event_type="effect.write",
            payload={},
            status=status,
            attempts=0 if status == Status.RECEIVED else 1,
            received_at=now - received_ago,
            updated_at=now,
            next_attempt_at=next_attempt_at,
            locked_until=next_attempt_at if status == Status.IN_PROGRESS else None,
            lease_id="b" * 32 if status == Status.IN_PROGRESS else "",
            processed_at=now if status == Status.COMPLETED else None,
        )
        for i in range(n)
    ]
    return InboxMessage.objects.bulk_create(rows)


def ago(**kwargs: float) -> datetime:
    return timezone.now() - timedelta(**kwargs)


def run(manage: Manage, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = manage("inbox_stats", *args, env=env)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


def counts(**given: int) -> dict[str, int]:
    return {status: given.get(status, 0) for status in STATUSES}


# --- the command's exit codes, on real processes --------------------------------------------


# --- collect() ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_collect_counts_per_consumer_and_status() -> None:
    make_rows(Status.RECEIVED, 3)
    make_rows(Status.IN_PROGRESS, 2)
    make_rows(Status.COMPLETED, 5)
    make_rows(Status.FAILED, 1, next_attempt_at=timezone.now() + timedelta(minutes=1))
    make_rows(Status.DEAD, 4)
    make_rows(Status.PARKED, 6)
    make_rows(Status.DEAD, 1, consumer="stream")
    make_rows(Status.COMPLETED, 7, consumer="stream")

    found = collect()

    assert found.consumers["effects"].counts == counts(
        received=3, in_progress=2, completed=5, failed=1, dead=4, parked=6
    )
    assert found.consumers["effects"].pending == 6
    assert found.consumers["stream"].counts == counts(dead=1, completed=7)
    assert found.consumers["audit"].counts == counts()
    assert found.totals() == counts(
        received=3, in_progress=2, completed=12, failed=1, dead=5, parked=6
    )
    assert (found.completed_total, found.completed_estimated) == (12, False)
    assert [(p.kind, p.consumer, p.value) for p in found.problems] == [
        ("dead", "effects", 4),
        ("dead", "stream", 1),
    ]
    assert not found.healthy
    assert json.loads(json.dumps(found.as_dict()))["totals"] == found.totals()


@pytest.mark.django_db
def test_collect_counts_stuck_rows_only_past_their_lease() -> None:
    make_rows(Status.IN_PROGRESS, 3, prefix="alive")
    make_rows(Status.IN_PROGRESS, 2, prefix="dead-worker", next_attempt_at=ago(seconds=30))
    make_rows(Status.IN_PROGRESS, 1, consumer="stream", next_attempt_at=ago(hours=2))

    found = collect()

    assert found.consumers["effects"].counts[Status.IN_PROGRESS] == 5
    assert found.consumers["effects"].stuck == 2
    assert found.consumers["stream"].stuck == 1
    assert [(p.kind, p.consumer, p.value) for p in found.problems] == [
        ("stuck", "effects", 2),
        ("stuck", "stream", 1),
    ]
    assert collect(ignore=("stuck",)).healthy


@pytest.mark.django_db
def test_oldest_pending_age_counts_due_rows_only() -> None:
    # A failed row whose retry is in the future is not waiting for a worker, however old.
    make_rows(
        Status.FAILED,
        1,
        prefix="backing-off",
        next_attempt_at=timezone.now() + timedelta(hours=1),
        received_ago=timedelta(days=2),
    )
    later = timezone.now() + timedelta(hours=1)
    make_rows(Status.RECEIVED, 1, prefix="scheduled", next_attempt_at=later)
    make_rows(Status.IN_PROGRESS, 1, prefix="running", received_ago=timedelta(days=3))
    make_rows(Status.PARKED, 1, prefix="parked")

    found = collect()
    effects = found.consumers["effects"]
    assert effects.oldest_pending_age == 0
    assert found.healthy
    # The oldest row still to process is the running one, received three days ago.
    assert effects.oldest_pending_received_at is not None
    assert timezone.now() - effects.oldest_pending_received_at >= timedelta(days=3)

    # A failed row past its backoff and a received row both wait; the older one counts.
    make_rows(Status.FAILED, 1, prefix="due-failed", next_attempt_at=ago(minutes=20))
    make_rows(Status.RECEIVED, 1, prefix="due-received", next_attempt_at=ago(minutes=10))
    make_rows(Status.RECEIVED, 1, consumer="stream", next_attempt_at=ago(minutes=1))

    found = collect()
    age = found.consumers["effects"].oldest_pending_age
    assert 20 * 60 <= age < 60 * 60, age
    assert 60 <= found.consumers["stream"].oldest_pending_age < 10 * 60
    # INBOX_MAX_PENDING_AGE (5 minutes) is exceeded by effects only.
    assert found.max_pending_age == 300
    assert [(p.kind, p.consumer) for p in found.problems] == [("pending_age", "effects")]
    assert collect(max_pending_age=3600).healthy
    assert [p.consumer for p in collect(max_pending_age=30).problems] == ["effects", "stream"]
    assert collect(ignore=("pending_age",)).healthy


@pytest.mark.django_db
def test_consumer_filter_and_exact() -> None:
    make_rows(Status.COMPLETED, 2)
    make_rows(Status.DEAD, 1)
    make_rows(Status.COMPLETED, 3, consumer="stream")
    make_rows(Status.RECEIVED, 1, consumer="stream")

    found = collect(consumer="stream")

    assert list(found.consumers) == ["stream"]
    assert found.consumers["stream"].counts == counts(completed=3, received=1)
    assert found.completed_total == 3
    assert found.healthy, "the other consumer's dead row is not this consumer's problem"

    exact = collect(exact=True)
    assert not exact.completed_estimated
    assert exact.totals() == counts(completed=5, dead=1, received=1)
    assert collect(consumer="nobody").consumers["nobody"].counts == counts()


@pytest.mark.django_db
def test_completed_rows_are_counted_on_a_small_table() -> None:
    make_rows(Status.COMPLETED, 50)
    if connection.vendor == "postgresql":
        # Give PostgreSQL a current estimate, so the size check really looks at 50 rows.
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {InboxMessage._meta.db_table}")
        assert stats_module.estimated_rows("default") == 50
    found = collect()
    assert found.completed_estimated is False
    assert found.completed_total == 50
    assert found.consumers["effects"].counts[Status.COMPLETED] == 50


def analyze() -> None:
    """Fresh statistics for the inbox's table (PostgreSQL's ``ANALYZE``; on InnoDB
    ``OPTIMIZE TABLE``, a rebuild then an analysis): a small table's estimate is then exact.

    InnoDB samples leaf pages and scales by their number: after earlier tests inserted and
    deleted thousands of rows, the emptied pages are still there and ``ANALYZE TABLE`` alone
    estimated 0 rows for a table of 55 (the MariaDB phase of CI failed on it once)."""
    with connection.cursor() as cursor:
        table = connection.ops.quote_name(InboxMessage._meta.db_table)
        if connection.vendor == "mysql":
            cursor.execute(f"OPTIMIZE TABLE {table}")
            cursor.fetchall()
        else:
            cursor.execute(f"ANALYZE {table}")


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_completed_rows_are_estimated_above_the_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a large table completed rows come from the database's estimate (PostgreSQL's
    planner, InnoDB's statistics); here the threshold is lowered so a small, freshly analysed
    table counts as large."""
    make_rows(Status.COMPLETED, 40)
    make_rows(Status.COMPLETED, 10, consumer="stream")
    make_rows(Status.DEAD, 2)
    make_rows(Status.RECEIVED, 3, consumer="stream")
    analyze()
    monkeypatch.setattr(stats_module, "ESTIMATE_ABOVE", 20)

    found = collect()

    assert found.completed_estimated is True
    assert found.completed_total == 50  # the estimate of a freshly analysed small table is exact
    assert found.consumers["effects"].counts[Status.COMPLETED] is None
    assert found.consumers["effects"].counts[Status.DEAD] == 2
    report: dict[str, Any] = json.loads(json.dumps(found.as_dict()))
    assert report["completed_estimated"] is True
    assert report["totals"]["completed"] == 50

    exact = collect(exact=True)
    assert exact.completed_estimated is False
    assert exact.consumers["effects"].counts[Status.COMPLETED] == 40
    assert exact.consumers["stream"].counts[Status.COMPLETED] == 10
    # One consumer of a large table: the planner's estimate of its completed rows.
    stream = collect(consumer="stream")
    assert stream.completed_estimated is True
    assert stream.consumers["stream"].counts[Status.COMPLETED] is None
    assert stream.completed_total == 10  # freshly analysed: the estimate is exact
    assert collect(consumer="stream", exact=True).consumers["stream"].counts["completed"] == 10

    from django_inbox.management.commands.inbox_stats import render

    table = render(found)
    assert "~50" in table and "--exact counts them" in table
