"""A dead worker's rows are found without reading the table: ``inbox_reclaim``'s look for
expired leases and the take-over's look for the rest of a dead worker's batch (by lease id)
read the ``in_progress`` rows' own index, whatever the table holds besides.

Before that index, both read every row of the table: with a million received rows, about
0.2 s per look on the test machine, once per ``inbox_reclaim`` run even with nothing to
reclaim, and again per batch it decides; a take-over ran the lease look inside the claim's
transaction. Both tests fail without the index, with statistics taken after the backlog or
before it (when they saw a history of completed rows only).
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.processing.claims import claim_batch
from django_inbox.services.reclaim import reclaim
from tests.plans import explain, rows_read, take_statistics

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TABLE = InboxMessage._meta.db_table
BACKLOG = 50_000
#: Rows a look may read: the in-progress rows (a few) and nothing of the backlog.
FEW = 100


def _backlog(status: str) -> None:
    """``BACKLOG`` rows of ``status``, due, of another consumer and of the test's."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (consumer, message_id, source, rerun, event_type, payload, "
            "headers, status, attempts, last_error, history, received_at, updated_at, "
            "next_attempt_at, lease_id, key) SELECT CASE WHEN i % 2 = 0 THEN 'effects' ELSE "
            f"'other' END, '{status}-' || i, '', false, 'effect.write', '{{}}', '{{}}', "
            f"'{status}', 0, '', '[]', now(), now() - interval '1 hour', "
            "now() - interval '1 minute', '', '' "
            f"FROM generate_series(1, {BACKLOG}) i"
        )


def _abandoned(lease: str, count: int) -> list[InboxMessage]:
    """``count`` rows of one dead worker's batch: ``in_progress`` under ``lease``, expired."""
    ids = [f"{lease}-{n}" for n in range(count)]
    for message_id in ids:
        store(consumer="effects", message_id=message_id, event_type="effect.write", payload={})
    until = timezone.now() - timedelta(seconds=30)
    InboxMessage.objects.filter(message_id__in=ids).update(
        status=InboxMessage.Status.IN_PROGRESS,
        attempts=1,
        lease_id=lease,
        locked_until=until,
        next_attempt_at=until,
        updated_at=until - timedelta(seconds=60),
    )
    return list(InboxMessage.objects.filter(message_id__in=ids).order_by("pk"))


def _statistics_and_backlog(statistics: str) -> None:
    """The backlog behind a history of completed rows, with statistics taken ``before`` the
    backlog was loaded (they saw the history only: autovacuum lags behind a burst) or
    ``after``."""
    _backlog("completed")
    if statistics == "before":
        take_statistics(TABLE)
    _backlog("received")
    if statistics == "after":
        take_statistics(TABLE)


def _reads_few(sql: str) -> None:
    plan = explain(sql, analyze=True)
    detail = json.dumps(plan, indent=1)
    assert rows_read(plan) <= FEW, (sql, detail)


@pytest.mark.parametrize("statistics", ["before", "after"])
def test_reclaim_finds_expired_leases_without_reading_the_backlog(statistics: str) -> None:
    _abandoned("lease-a", 3)
    _statistics_and_backlog(statistics)
    with CaptureQueriesContext(connection) as queries:
        result = reclaim(dry_run=True)
    assert len(result.rows) == 3
    look = next(q["sql"] for q in queries if "FOR UPDATE SKIP LOCKED" in q["sql"])
    _reads_few(look)


@pytest.mark.parametrize("statistics", ["before", "after"])
def test_a_take_over_finds_the_rest_of_a_dead_workers_batch_by_its_lease(statistics: str) -> None:
    """A claim that takes over one row of a dead worker's batch decides the whole batch: it
    looks the batch's other rows up by lease id."""
    rows = _abandoned("lease-b", 5)
    _statistics_and_backlog(statistics)
    with CaptureQueriesContext(connection) as queries:
        claimed = claim_batch("effects", 1, message_id=rows[2].message_id)
    assert [row.message_id for row in claimed] == [rows[2].message_id]
    members = [q["sql"] for q in queries if '"lease_id" IN' in q["sql"]]
    assert members, [q["sql"] for q in queries]
    _reads_few(members[0])
