"""Statements that find their rows by primary key or message id and also test the status keep
reading by that index whatever PostgreSQL's statistics say: statistics taken before a backlog
of one status let the planner answer a status test from that status's partial index, read
whole (see django_inbox/db/aside.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_inbox import store
from django_inbox.db import statements
from django_inbox.models import InboxMessage
from django_inbox.processing.claims import claim_batch
from django_inbox.services.purge import purge
from django_inbox.services.selection import count_by_status, find, select
from tests.plans import explain, indexes, rows_read, take_statistics

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TABLE = InboxMessage._meta.db_table
PKEY = f"{TABLE}_pkey"
UNIQUE = "django_inbox_identity_idx"


def _backlog(status: str, *, due: str = "now() - interval '1 minute'") -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (consumer, message_id, source, rerun, event_type, payload, "
            "headers, status, attempts, last_error, history, received_at, updated_at, "
            "next_attempt_at, lease_id, key) SELECT 'effects', md5(i::text), '', false, "
            f"'effect.write', '{{}}', '{{}}', '{status}', 1, '', '[]', now(), "
            f"now() - interval '60 days', {due}, '', '' FROM generate_series(1, 50000) i"
        )


def _completed(count: int = 50) -> None:
    """What the statistics see: completed rows only."""
    for n in range(count):
        store(consumer="effects", message_id=f"c-{n}", event_type="effect.write", payload={})
    InboxMessage.objects.update(status="completed", next_attempt_at=None)


def _plan_reads(sql: str, expected: set[str]) -> None:
    plan = explain(sql)
    assert indexes(plan) == expected, (sql, json.dumps(plan, indent=1))


def test_a_claim_by_id_that_finds_the_message_busy_reads_it_by_its_id() -> None:
    """The message is claimed by another worker (lease not expired), so the one-statement
    claim by id finds nothing and the general claim looks for an abandoned lease of it: that
    look reads the message by its id, not the 50,000 due rows' index. (With these statistics
    it did so before its status test was written aside too: this guards the plan.)"""
    _completed()
    store(consumer="effects", message_id="busy", event_type="effect.write", payload={})
    take_statistics(TABLE)
    _backlog("received")
    assert claim_batch("effects", 1, message_id="busy")
    with CaptureQueriesContext(connection) as queries:
        assert claim_batch("effects", 1, message_id="busy") == []
    look = next(q["sql"] for q in queries if "FOR UPDATE SKIP LOCKED" in q["sql"])
    _plan_reads(look, {UNIQUE})


def test_an_operators_change_of_a_selection_reads_its_rows_by_primary_key() -> None:
    """Replay, retry or park of selected rows (one UPDATE per status, the history appended in
    SQL), with 50,000 dead rows that the statistics never saw."""
    _completed()
    take_statistics(TABLE)
    _backlog("dead", due="NULL")
    pks = list(InboxMessage.objects.filter(status="dead").values_list("pk", flat=True)[:100])
    entry = {"kind": "replay", "at": timezone.now().isoformat()}
    with CaptureQueriesContext(connection) as queries:
        statements.update_appending_history(
            pks, ["dead"], {"status": "received", "next_attempt_at": timezone.now()}, entry,
            "default",
        )  # fmt: skip
    update = next(q["sql"] for q in queries if q["sql"].startswith("UPDATE"))
    _plan_reads(update, {PKEY})


def test_the_purge_of_dead_rows_deletes_each_batch_by_primary_key() -> None:
    """``inbox_purge`` of dead rows past their retention, 50,000 of them unseen by the
    statistics: the delete re-checks each selected row's status by primary key."""
    _completed()
    take_statistics(TABLE)
    _backlog("dead", due="NULL")
    with CaptureQueriesContext(connection) as queries:
        result = purge(statuses=("dead",), older_than=30 * 86400, batch_size=1000)
    assert sum(result.deleted.values()) == 50000
    _backlog("dead", due="NULL")  # the same backlog again, for the plan
    delete = next(q["sql"] for q in queries if q["sql"].startswith("DELETE"))
    plan = explain(delete)
    [scan] = [node for node in plan["Plans"] if node["Parent Relationship"] != "InitPlan"]
    assert scan.get("Index Name") == PKEY, json.dumps(plan, indent=1)


def test_a_take_over_claims_the_abandoned_row_by_primary_key() -> None:
    """A worker died holding a message (its lease expired); a claim of it by id takes it over:
    the claim's ``UPDATE`` of the chosen row reads it by primary key, not the 50,000 due rows'
    index. (It read so before its status test was written aside too: this guards the plan.)"""
    _completed()
    store(consumer="effects", message_id="abandoned", event_type="effect.write", payload={})
    take_statistics(TABLE)
    _backlog("received")
    assert claim_batch("effects", 1, message_id="abandoned")  # the worker that dies
    past = timezone.now() - timedelta(minutes=5)
    InboxMessage.objects.filter(message_id="abandoned").update(
        locked_until=past, next_attempt_at=past
    )
    with CaptureQueriesContext(connection) as queries:
        [taken] = claim_batch("effects", 1, message_id="abandoned")
    assert taken.message_id == "abandoned" and taken.attempts == 2
    chosen = f'"{TABLE}"."id" IN ('
    claim = next(q["sql"] for q in queries if q["sql"].startswith("UPDATE") and chosen in q["sql"])
    _plan_reads(claim, {PKEY})


def _reads_by_id(sql: str, expected: set[str]) -> None:
    plan = explain(sql, analyze=True)
    assert rows_read(plan) <= 10, (sql, json.dumps(plan, indent=1))
    assert indexes(plan) <= expected, (sql, json.dumps(plan, indent=1))


def test_inbox_show_finds_message_ids_by_the_unique_index() -> None:
    """No consumer given: the message id is looked up in every consumer by name (the digests
    of each consumer's pair, in the unique index of identities), not by reading the table."""
    _completed()
    take_statistics(TABLE)
    _backlog("dead", due="NULL")
    with CaptureQueriesContext(connection) as queries:
        [found] = find(message_ids=["c-3"])
    assert found.consumer == "effects" and found.status == "completed"
    look = next(q["sql"] for q in queries if "sha256(" in q["sql"])
    _reads_by_id(look, {UNIQUE})


@pytest.mark.parametrize("by", ["message_ids", "pks"])
def test_a_replay_of_rows_picked_by_id_reads_them_by_id(by: str) -> None:
    """``inbox_replay --message-id`` / ``--id`` (and the admin's selection): the confirmation's
    count and every batch read the picked rows by index, the last (empty) batch too, and the
    status test does not send the planner to the 50,000 dead rows' partial index."""
    from django_inbox.services import operator

    _completed()
    take_statistics(TABLE)
    _backlog("dead", due="NULL")
    picked = list(InboxMessage.objects.filter(status="dead").order_by("pk")[:3])
    ids: dict[str, Any] = {
        "message_ids": [row.message_id for row in picked],
        "pks": [row.pk for row in picked],
    }
    with CaptureQueriesContext(connection) as queries:
        rows = select(**{by: ids[by]}, statuses=["dead", "parked"])
        assert count_by_status(rows) == {"dead": 3}
        assert sum(operator.replay(rows, actor="test").changed.values()) == 3
    looks = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
    assert len(looks) >= 4, looks  # the lookup or count, the refusals, two batches
    for look in looks:
        plan = explain(look, analyze=True)
        assert rows_read(plan) <= 10, (look, json.dumps(plan, indent=1))


def _history_then_dead(statistics: str) -> None:
    """100,000 completed rows, then 20,000 dead ones at the table's end (an outage's dead
    letters); statistics taken ``before`` the dead rows came (autovacuum lags) or ``after``."""
    _history()
    if statistics == "before":
        take_statistics(TABLE)
    _dead("d")
    if statistics == "after":
        take_statistics(TABLE)


def _history() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (consumer, message_id, source, rerun, event_type, payload, "
            "headers, status, attempts, last_error, history, received_at, updated_at, "
            "next_attempt_at, lease_id, key) SELECT 'effects', 'h-' || i, '', false, "
            "'effect.write', '{}', '{}', 'completed', 1, '', '[]', now(), now(), NULL, '', '' "
            "FROM generate_series(1, 100000) i"
        )


def _dead(prefix: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (consumer, message_id, source, rerun, event_type, payload, "
            "headers, status, attempts, last_error, history, received_at, updated_at, "
            f"next_attempt_at, lease_id, key) SELECT 'effects', '{prefix}-' || i, '', false, "
            "'effect.write', '{}', '{}', 'dead', 3, 'down', '[]', now(), "
            "now() - interval '60 days', NULL, '', '' FROM generate_series(1, 20000) i"
        )


def _batch_reads_its_rows(sql: str, batch: int) -> None:
    plan = explain(sql, analyze=True)
    assert rows_read(plan) <= batch + 10, (sql, json.dumps(plan, indent=1))


@pytest.mark.parametrize("statistics", ["before", "after"])
def test_a_replay_of_every_dead_row_reads_each_batch_only(statistics: str) -> None:
    """``inbox_replay --status dead`` after an outage: each batch (``status IN (…) AND id >
    last ORDER BY id LIMIT n``) reads its own rows through the dead and parked rows' id index,
    not the history before them nor every dead row sorted."""
    from django_inbox.services import operator

    _history_then_dead(statistics)
    with CaptureQueriesContext(connection) as queries:
        result = operator.replay(
            select(statuses=["dead", "parked"]), actor="test", dry_run=True, batch_size=500
        )
    assert sum(result.changed.values()) == 20000
    batches = [q["sql"] for q in queries if "LIMIT 500" in q["sql"]]
    _batch_reads_its_rows(batches[0], 500)
    _batch_reads_its_rows(batches[-2], 500)


@pytest.mark.parametrize("statistics", ["before", "after"])
def test_the_purge_of_dead_rows_reads_each_batch_only(statistics: str) -> None:
    _history_then_dead(statistics)
    with CaptureQueriesContext(connection) as queries:
        result = purge(statuses=("dead",), older_than=30 * 86400, batch_size=1000)
    assert result.deleted == {"dead": 20000}
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    _dead("again")  # dead rows again, for the plans of the statements captured
    _batch_reads_its_rows(deletes[0], 2 * 1000)  # the selection, then the rows by primary key


def test_the_admins_event_type_filter_reads_the_newest_dead_rows_only() -> None:
    """Its choices: the handlers' event types and those of the newest dead and parked rows,
    read backwards from the attention rows' id index (a ``DISTINCT`` over all of them read
    every one, on every page of the changelist)."""
    from django.test import RequestFactory

    from django_inbox.admin.filters import RECENT_ATTENTION, EventTypeFilter

    _history_then_dead("after")
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET event_type = 'order.lost' WHERE message_id = 'd-20000'")
    request = RequestFactory().get("/")
    with CaptureQueriesContext(connection) as queries:
        choices = EventTypeFilter(request, {}, InboxMessage, None).lookups(request, None)
    assert ("order.lost", "order.lost") in choices and ("effect.write", "effect.write") in choices
    look = next(q["sql"] for q in queries if "event_type" in q["sql"])
    _batch_reads_its_rows(look, RECENT_ATTENTION)
