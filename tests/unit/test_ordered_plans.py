"""The release of a key's next version keeps a plan that reads that version's rows only,
whatever PostgreSQL's statistics say (they may date from before a backlog of waiting rows)."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_inbox.db import statements
from django_inbox.models import InboxMessage

from ..plans import explain, indexes, rows_read

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

_COLUMNS = (
    "consumer, message_id, source, rerun, event_type, payload, headers, status, attempts, "
    "last_error, history, received_at, updated_at, next_attempt_at, lease_id, key, sequence"
)


def _rows(select: str) -> str:
    return f"INSERT INTO {InboxMessage._meta.db_table} ({_COLUMNS}) {select}"


def test_releasing_a_keys_next_version_reads_that_version_whatever_the_statistics_say() -> None:
    """Statistics taken with no row waiting, then 50,000 versions of other keys wait (their
    gaps open): releasing one key's next version reads its own rows, not every waiting row.
    (Answered from the waiting rows' deadline index, it read all of them for each release.)"""
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            _rows(
                "SELECT 'orders', 'c-' || i, '', false, 'order.changed', '{}', '{}', "
                "'completed', 1, '', '[]', now(), now(), NULL, '', 'key-' || (i % 50), i "
                "FROM generate_series(1, 500) i"
            )
        )
        cursor.execute(f"ANALYZE {table}")
        cursor.execute(
            _rows(
                "SELECT 'orders', 'w-' || i, '', false, 'order.changed', '{}', '{}', "
                "'waiting', 0, 'a gap', '[]', now(), now(), now() + interval '1 hour', '', "
                "'other-' || i, 2 FROM generate_series(1, 50000) i"
            )
        )
        cursor.execute(
            _rows(
                "SELECT 'orders', 'next', '', false, 'order.changed', '{}', '{}', 'waiting', 0, "
                "'a gap', '[]', now(), now(), now() + interval '1 hour', '', 'mine', 2"
            )
        )
    with CaptureQueriesContext(connection) as queries:
        assert statements.advance("orders", "mine", 1, timezone.now(), "default") == ["next"]
    release = next(q["sql"] for q in queries if "RETURNING" in q["sql"])
    plan = explain(release, analyze=True)
    assert rows_read(plan) <= 10, json.dumps(plan, indent=1)
    assert f"{table.removesuffix('_inboxmessage')}_waiting_idx" not in indexes(plan)


def test_a_gap_sweep_reads_each_waiting_row_it_looks_at_by_primary_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Statistics taken with no row waiting, then 50,000 waiting rows past their deadline: each
    row the sweep looks at is read and changed by primary key, not found by filtering the
    waiting rows' whole index on its id (5 ms a row at 50,000)."""
    from django_inbox import gaps

    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            _rows(
                "SELECT 'orders', 'c-' || i, '', false, 'order.changed', '{}', '{}', "
                "'completed', 1, '', '[]', now(), now(), NULL, '', 'key-' || (i % 50), i "
                "FROM generate_series(1, 500) i"
            )
        )
        cursor.execute(f"ANALYZE {table}")
        cursor.execute(
            _rows(
                "SELECT 'orders', 'w-' || i, '', false, 'order.changed', '{}', '{}', "
                "'waiting', 0, 'a gap', '[]', now(), now(), now() - interval '1 minute', '', "
                "'other-' || i, 2 FROM generate_series(1, 50000) i"
            )
        )
    monkeypatch.setattr(gaps, "SWEEP_BATCH", 3)
    with CaptureQueriesContext(connection) as queries:
        assert gaps.park_expired_gaps(consumer="orders") == 3
    by_id = [q["sql"] for q in queries if f'"{table}"."id" = ' in q["sql"]]
    assert len(by_id) >= 6  # each row: read, then parked
    for sql in by_id:
        plan = explain(sql)
        assert indexes(plan) == {f"{table}_pkey"}, (sql, json.dumps(plan, indent=1))
