"""A claim takes at most its batch of due rows, each exactly once, whatever else holds rows."""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.processing import leases
from django_inbox.processing.claims import claim_batch
from tests.plans import explain, indexes, rows_read, take_statistics

pytestmark = pytest.mark.django_db(transaction=True)


def _store(count: int) -> None:
    for n in range(count):
        store(consumer="effects", message_id=f"c-{n}", event_type="effect.write", payload={})


@pytest.mark.parametrize("limit", [1, 5, 37])
def test_a_claim_never_takes_more_than_its_limit(limit: int) -> None:
    _store(100)
    claimed = claim_batch("effects", limit)
    assert len(claimed) == limit
    in_progress = InboxMessage.objects.filter(status="in_progress")
    assert in_progress.count() == limit
    assert {row.pk for row in in_progress} == {row.pk for row in claimed}
    assert all(row.attempts == 1 for row in claimed)


@pytest.mark.server_db
def test_concurrent_claims_split_the_rows_and_skip_locked_ones() -> None:
    """Claims from several connections at once: every row claimed exactly once, no claim
    over its limit, and a row locked by someone else is skipped rather than waited for."""
    _store(300)
    locked_pk = InboxMessage.objects.order_by("pk").values_list("pk", flat=True)[0]
    holder = connections.create_connection("default")
    with holder.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute(
            f"SELECT id FROM {InboxMessage._meta.db_table} WHERE id = %s FOR UPDATE", [locked_pk]
        )
        results: list[list[int]] = []
        barrier = threading.Barrier(4)

        def claimer() -> None:
            barrier.wait()
            got: list[int] = []
            while True:
                batch = claim_batch("effects", 7)
                assert len(batch) <= 7
                if not batch:
                    break
                got += [row.pk for row in batch]
            results.append(got)
            connections.close_all()

        threads = [threading.Thread(target=claimer) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        cursor.execute("ROLLBACK")
    holder.close()
    claimed = [pk for got in results for pk in got]
    assert len(results) == 4
    assert len(claimed) == len(set(claimed)) == 299
    assert locked_pk not in claimed


def test_a_dead_workers_batch_is_blamed_once_even_when_claims_split_it() -> None:
    """Rows of one dead worker's batch taken over by claims smaller than the batch: only the
    row that was running (the lowest pk) has its attempt counted, once."""
    _store(4)
    dead_batch = claim_batch("effects", 4)  # a worker claims four rows, then dies
    assert len({row.lease_id for row in dead_batch}) == 1
    past = timezone.now() - timedelta(seconds=60)
    InboxMessage.objects.filter(status="in_progress").update(
        next_attempt_at=past, locked_until=past
    )
    first = claim_batch("effects", 2)
    second = claim_batch("effects", 2)
    assert sorted(row.message_id for row in [*first, *second]) == ["c-0", "c-1", "c-2", "c-3"]
    rows = {row.message_id: row for row in InboxMessage.objects.all()}
    blamed = [mid for mid, row in rows.items() if row.errors]
    assert blamed == ["c-0"]
    assert [entry["type"] for entry in rows["c-0"].errors] == ["LeaseExpired"]
    assert {mid: row.attempts for mid, row in rows.items()} == {
        "c-0": 2,
        "c-1": 1,
        "c-2": 1,
        "c-3": 1,
    }


def _backlog_the_statistics_never_saw(due: str) -> str:
    """50 completed rows, the table's statistics taken (and kept), then 50,000 ``received``
    rows due at ``due`` (SQL) that the statistics never saw; returns the table's name."""
    _store(50)
    for row in claim_batch("effects", 50):
        assert leases.complete(row, timezone.now(), "default")
    table = InboxMessage._meta.db_table
    take_statistics(table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (consumer, message_id, source, rerun, event_type, payload, "
            "headers, status, attempts, last_error, history, received_at, updated_at, "
            "next_attempt_at, lease_id, key) SELECT 'effects', md5(i::text), '', false, "
            f"'effect.write', '{{}}', '{{}}', 'received', 0, '', '[]', now(), now(), {due}, '', '' "
            "FROM generate_series(1, 50000) i"
        )
    return table


@pytest.mark.postgres
@pytest.mark.parametrize("change", ["complete", "fail", "release"])
def test_a_claimed_rows_fenced_change_reads_its_primary_key_whatever_the_statistics_say(
    change: str,
) -> None:
    """Statistics taken when no row was due, then a backlog: a fenced change of a claimed row
    still finds it by primary key. (With ``status = 'in_progress'`` in its ``WHERE``, the
    planner read the polled rows' partial index, all of it, for every completion.)"""
    table = _backlog_the_statistics_never_saw("now()")
    row = claim_batch("effects", 10)[3]
    now = timezone.now()
    run = {
        "complete": lambda: leases.complete(row, now, "default"),
        "fail": lambda: leases.fenced(row, "default").update(status="failed", lease_id=""),
        "release": lambda: leases.release(row, now, "default"),
    }[change]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        assert run()
        update = next(q["sql"] for q in queries if q["sql"].startswith("UPDATE"))
        plan = explain(update)
    assert indexes(plan) == {f"{table}_pkey"}, json.dumps(plan, indent=1)


@pytest.mark.postgres
def test_a_claim_of_one_message_by_its_id_reads_that_message_whatever_the_statistics_say() -> None:
    """Statistics taken when no row was due, then a backlog of 50,000 due rows: claiming one
    message by its id (a redelivery, an ordered consumer's released version) reads that row.
    (With a plain ``status IN (…)``, the planner read the polled rows' partial index, the
    whole backlog, to find it.)"""
    _backlog_the_statistics_never_saw("now() - interval '1 minute'")
    with connection.cursor() as cursor:
        cursor.execute("SELECT md5('777')")
        wanted = cursor.fetchone()[0]
    with CaptureQueriesContext(connection) as queries:
        [claimed] = claim_batch("effects", 1, message_id=wanted)
    assert claimed.message_id == wanted
    claim = next(q["sql"] for q in queries if q["sql"].startswith("UPDATE"))
    plan = explain(claim, analyze=True)
    assert rows_read(plan) <= 1, json.dumps(plan, indent=1)
    assert indexes(plan) == {"django_inbox_identity_idx"}, json.dumps(plan, indent=1)
