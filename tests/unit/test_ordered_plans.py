"""An ordered consumer's lookups of a key's version keep plans that read that version's rows
only, whatever PostgreSQL's statistics say (they may date from before a backlog of waiting
rows)."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_inbox.db import statements
from django_inbox.models import InboxMessage
from django_inbox.ordered import gaps, ordering
from tests.plans import explain, indexes, rows_read, take_statistics

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TABLE = InboxMessage._meta.db_table
_COLUMNS = (
    "consumer, message_id, source, rerun, event_type, payload, headers, status, attempts, "
    "last_error, history, received_at, updated_at, next_attempt_at, lease_id, key, sequence"
)


def _rows(select: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TABLE} ({_COLUMNS}) {select}")


def _completed_versions() -> None:
    """What the statistics see: 500 completed versions of 50 keys, nothing waiting."""
    _rows(
        "SELECT 'orders', 'c-' || i, '', false, 'order.changed', '{}', '{}', 'completed', 1, "
        "'', '[]', now(), now(), NULL, '', 'key-' || (i % 50), i FROM generate_series(1, 500) i"
    )


def _waiting(deadline: str, since: str = "now()") -> None:
    """Then 50,000 versions of other keys wait for a gap since ``since``, until ``deadline``."""
    _rows(
        "SELECT 'orders', 'w-' || i, '', false, 'order.changed', '{}', '{}', 'waiting', 0, "
        f"'a gap', '[]', now(), {since}, {deadline}, '', 'other-' || i, 2 "
        "FROM generate_series(1, 50000) i"
    )
    _rows(
        "SELECT 'orders', 'next', '', false, 'order.changed', '{}', '{}', 'waiting', 0, "
        f"'a gap', '[]', now(), {since}, {deadline}, '', 'mine', 2"
    )


def _reads_the_version_only(sql: str) -> None:
    plan = explain(sql, analyze=True)
    assert rows_read(plan) <= 10, json.dumps(plan, indent=1)
    assert "django_inbox_waiting_idx" not in indexes(plan), json.dumps(plan, indent=1)


def test_releasing_a_keys_next_version_reads_that_version_whatever_the_statistics_say() -> None:
    """Releasing one key's next version (the statement a worker's completion or a delivered
    version sends) reads its own rows, not every waiting row (it read 50,000: answered from
    the waiting rows' deadline index)."""
    _completed_versions()
    take_statistics(TABLE)
    _waiting("now() + interval '1 hour'")
    with CaptureQueriesContext(connection) as queries:
        assert statements.advance("orders", "mine", 1, timezone.now(), "default") == ["next"]
    _reads_the_version_only(next(q["sql"] for q in queries if "RETURNING" in q["sql"]))


def test_the_orm_release_reads_that_version_whatever_the_statistics_say() -> None:
    """The same release as the ORM sends it (an operator's skip ahead, a replay past a gap)."""
    _completed_versions()
    take_statistics(TABLE)
    _waiting("now() + interval '1 hour'")
    with CaptureQueriesContext(connection) as queries:
        assert ordering.release_next("orders", "mine", 2, timezone.now(), "default") == ["next"]
    [read, update] = [q["sql"] for q in queries if "'mine'" in q["sql"]]
    _reads_the_version_only(read)
    _reads_the_version_only(update)


def test_a_gap_sweep_reads_each_waiting_row_it_looks_at_by_primary_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """50,000 waiting rows past their deadline: each row the sweep looks at is read and
    changed by primary key, not found by filtering the waiting rows' whole index on its id
    (5 ms a row at 50,000)."""
    _completed_versions()
    take_statistics(TABLE)
    # waiting since longer than gap_timeout (10 minutes): parked when looked at
    _waiting("now() - interval '1 minute'", since="now() - interval '11 minutes'")
    monkeypatch.setattr(gaps, "SWEEP_BATCH", 3)
    with CaptureQueriesContext(connection) as queries:
        assert gaps.park_expired_gaps(consumer="orders") == 3
    by_id = [q["sql"] for q in queries if f'"{TABLE}"."id" = ' in q["sql"]]
    assert len(by_id) >= 6  # each row: read, then parked
    for sql in by_id:
        plan = explain(sql)
        assert indexes(plan) == {f"{TABLE}_pkey"}, (sql, json.dumps(plan, indent=1))


def test_the_admins_key_view_reads_the_keys_versions_only() -> None:
    """Through the sequence index, whatever else the table holds (the view's lookup once left
    out ``sequence IS NOT NULL``, which that partial index needs, and read the table)."""
    from django_inbox.admin.render import key_versions

    _completed_versions()
    _rows(
        "SELECT 'orders', 'u-' || i, '', false, 'order.changed', '{}', '{}', 'completed', 1, "
        "'', '[]', now(), now(), NULL, '', '', NULL FROM generate_series(1, 50000) i"
    )
    take_statistics(TABLE)
    with CaptureQueriesContext(connection) as queries:
        view = key_versions("orders", "key-7", 50)
    assert [item["row"].sequence for item in view["rows"]] == list(range(7, 501, 50))
    look = next(q["sql"] for q in queries if '"sequence"' in q["sql"] and "ORDER BY" in q["sql"])
    plan = explain(look, analyze=True)
    assert rows_read(plan) <= 20, json.dumps(plan, indent=1)
    assert indexes(plan) == {"django_inbox_sequence_idx"}, json.dumps(plan, indent=1)
