"""The outbox's held rows: a row written behind a pending row of its key waits without a due
time, so claims never read a key's backlog; the relay that settles the earlier row, the
publisher once it commits, and the relays' sweep make it due. Against the real database, no
broker (tests/system/test_outbox.py has the relay)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_inbox.outbox import publish, services
from django_inbox.outbox import rows as relay_rows
from django_inbox.outbox.held import holds_rows
from django_inbox.outbox.models import OutboxMessage
from tests.plans import explain, indexes, rows_read, take_statistics

pytestmark = pytest.mark.django_db(transaction=True)
Status = OutboxMessage.Status
TABLE = OutboxMessage._meta.db_table
COLUMNS = (
    "message_id, event_type, payload, headers, exchange, routing_key, key, status, attempts, "
    "last_error, created_at, updated_at, next_attempt_at, lease_id, causation_consumer, "
    "causation_message_id"
)


#: MySQL and MariaDB hold no rows: every row is due, and a claim's "first of its key" test
#: alone keeps a key's order (``held.holds_rows``).
HOLDS = holds_rows("default")
needs_holding = pytest.mark.skipif(not HOLDS, reason="MySQL and MariaDB hold no rows")


def keyed(key: str, n: int) -> list[str]:
    ids = [publish("order.placed", {"n": i}, routing_key="orders", key=key) for i in range(n)]
    return [i for i in ids if i is not None]


def due_rows(key: str) -> list[str]:
    return list(
        OutboxMessage.objects.filter(key=key, status=Status.PENDING, next_attempt_at__isnull=False)
        .order_by("pk")
        .values_list("message_id", flat=True)
    )


def test_a_keys_later_rows_are_held_until_the_one_before_is_settled() -> None:
    first, second, third = keyed("order-1", 3)
    other = keyed("order-2", 1)
    if HOLDS:
        assert due_rows("order-1") == [first] and due_rows("order-2") == other
    lease, claimed = relay_rows.claim(10, "default")
    assert sorted(row.message_id for row in claimed) == sorted([first, *other])
    pks = {row.message_id: row.pk for row in claimed}
    relay_rows.mark_sent([pks[first]], lease, "default", keys=["order-1"])
    if HOLDS:
        assert due_rows("order-1") == [second]  # released by the mark, the third still held
    lease, claimed = relay_rows.claim(10, "default")
    assert [row.message_id for row in claimed] == [second]
    with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=1):
        assert relay_rows.fail(claimed[0], lease, "refused", "default") == Status.DEAD
    if HOLDS:
        assert due_rows("order-1") == [third]  # a dead row holds its key back no longer
    _, claimed = relay_rows.claim(10, "default")
    assert [row.message_id for row in claimed] == [third]


def test_a_claim_reads_a_hot_keys_head_only_however_long_its_backlog() -> None:
    hot = keyed("hot", 400)
    others = [keyed(f"cold-{i}", 1)[0] for i in range(5)]
    assert due_rows("hot") == (hot[:1] if HOLDS else hot)
    if connection.vendor == "postgresql":
        # With statistics saying one key fills the table, a claim still reads a handful of
        # index entries: the due rows, and one key-index entry per keyed due row. (Before
        # rows were held it walked the hot key's 399 later rows; with a plain NOT EXISTS,
        # PostgreSQL checked the hot key's head by a scan of the whole table.)
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {OutboxMessage._meta.db_table}")
        with CaptureQueriesContext(connection) as queries:
            _, claimed = relay_rows.claim(100, "default")
        claim_sql = next(q["sql"] for q in queries if "SKIP LOCKED" in q["sql"])
        OutboxMessage.objects.update(locked_until=None)
        plan = explain(claim_sql, analyze=True)
        assert 0 < rows_read(plan) <= 60, json.dumps(plan, indent=1)
    else:
        _, claimed = relay_rows.claim(100, "default")
    assert sorted(row.message_id for row in claimed) == sorted([hot[0], *others])


@pytest.mark.postgres
@pytest.mark.parametrize("settle", ["mark_sent", "give_back"])
def test_settling_a_batch_reads_its_own_rows_whatever_the_statistics_say(settle: str) -> None:
    """Statistics taken before a backlog (no pending row then): settling a claimed batch
    still reads the batch's rows by primary key, not every pending row (it read 199,900)."""
    for n in range(50):
        publish("order.placed", {"n": n}, routing_key="orders")
    lease, claimed = relay_rows.claim(100, "default")
    relay_rows.mark_sent([row.pk for row in claimed], lease, "default")
    with connection.cursor() as cursor:
        take_statistics(TABLE)
        cursor.execute(
            f"INSERT INTO {TABLE} ({COLUMNS}) SELECT md5(i::text), 'order.placed', '{{}}', "
            "'{}', '', 'orders', '', 'pending', 0, '', now(), now(), now(), '', '', '' "
            "FROM generate_series(1, 50000) i"
        )
    lease, claimed = relay_rows.claim(100, "default")
    pks = [row.pk for row in claimed]
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        assert getattr(relay_rows, settle)(pks, lease, "default") == 100
        update = next(q["sql"] for q in queries if q["sql"].startswith("UPDATE"))
        plan = explain(update, analyze=True)
    assert rows_read(plan) <= len(pks), json.dumps(plan, indent=1)


@pytest.mark.postgres
def test_the_purge_deletes_its_batch_by_primary_key_whatever_the_statistics_say() -> None:
    """Statistics taken before any row was sent, then 50,000 sent rows past their retention:
    each of the purge's deletes reads its batch by primary key, not every sent row."""
    for n in range(50):
        publish("order.placed", {"n": n}, routing_key="orders")
    with connection.cursor() as cursor:
        take_statistics(TABLE)
        cursor.execute(
            f"INSERT INTO {TABLE} ({COLUMNS}, sent_at) SELECT md5(i::text), 'order.placed', "
            "'{}', '{}', '', 'orders', '', 'sent', 1, '', now(), now(), NULL, '', '', '', "
            "now() - interval '30 days' FROM generate_series(1, 50000) i"
        )
    with CaptureQueriesContext(connection) as queries:
        assert services.purge(older_than=3600, batch_size=1000) == 50000
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 50
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} ({COLUMNS}, sent_at) SELECT md5(i::text), 'order.placed', "
            "'{}', '{}', '', 'orders', '', 'sent', 1, '', now(), now(), NULL, '', '', '', "
            "now() - interval '30 days' FROM generate_series(1, 50000) i"
        )
    plan = explain(deletes[0], analyze=True)  # the same 50,000 sent rows, other ids
    assert rows_read(plan) <= 1000, json.dumps(plan, indent=1)
    assert indexes(plan) == {f"{TABLE}_pkey"}, json.dumps(plan, indent=1)


@needs_holding
def test_a_row_held_behind_a_row_sent_before_it_committed_is_released_by_the_sweep() -> None:
    first, second = keyed("order-1", 2)
    # The race: the relay marked the first sent before the transaction writing the second
    # committed, so its release did not see it. Nothing else makes the second due.
    OutboxMessage.objects.filter(message_id=first).update(status=Status.SENT)
    blocked, _behind = keyed("order-2", 2)
    assert due_rows("order-1") == []
    assert relay_rows.sweep("default") == 1
    assert due_rows("order-1") == [second]
    assert due_rows("order-2") == [blocked]  # still behind a pending row: left held
    assert relay_rows.sweep("default") == 0


@pytest.mark.postgres
def test_a_row_held_while_its_predecessor_was_settled_is_released_once_it_commits() -> None:
    """The race, as it happens on a busy key: the relay marks the key's previous row sent and
    looks for a held row to release while the transaction that wrote one is still open. The
    publisher releases its rows itself once it commits, in one statement for all its keys."""
    from django_inbox.outbox.publishing import _Release

    firsts = keyed("busy", 1) + keyed("other", 1)
    seen: dict[str, Any] = {}

    def relay_settles_the_firsts() -> None:  # another session, as a relay is
        try:
            OutboxMessage.objects.filter(message_id__in=firsts).update(status=Status.SENT)
            seen["released"] = relay_rows.release(["busy", "other"], "default")
        finally:
            connections.close_all()

    with transaction.atomic():
        held = keyed("busy", 2) + keyed("other", 1)  # held: the first rows are pending
        relay = threading.Thread(target=relay_settles_the_firsts)
        relay.start()
        relay.join()
        assert seen["released"] == 0  # the relay could not see these rows
        releases = [c for _, c, _ in connection.run_on_commit if isinstance(c, _Release)]
        assert len(releases) == 1 and releases[0].keys == {"busy", "other"}
    assert due_rows("busy") == held[:1]  # released by their publisher, after the commit
    assert due_rows("other") == held[2:]


def _releases() -> list[Any]:
    """The releases the current transaction left for after its commit."""
    from django_inbox.outbox.publishing import _Release

    return [c for _, c, _ in connection.run_on_commit if isinstance(c, _Release)]


def _sent_in_order(key: str, expected: list[str]) -> None:
    """A relay's claims and marks send ``key``'s rows one at a time, in ``expected`` order."""
    for message_id in expected:
        lease, claimed = relay_rows.claim(10, "default")
        assert [row.message_id for row in claimed] == [message_id]
        relay_rows.mark_sent([claimed[0].pk], lease, "default", keys=[key])
    assert relay_rows.claim(10, "default")[1] == []


@pytest.mark.postgres
def test_rows_held_behind_a_row_of_their_own_transaction_need_no_release_after_it() -> None:
    """A transaction publishing several events of one key holds the later ones behind its own
    first row, which no relay can settle before the commit: the publisher leaves no release
    for after its commit (one statement less), and the relay releases each row in turn."""
    with transaction.atomic():
        ids = keyed("order-7", 3)
        assert _releases() == []
    assert due_rows("order-7") == ids[:1]
    _sent_in_order("order-7", ids)


@pytest.mark.postgres
def test_rows_held_behind_a_row_written_in_a_savepoint_are_released_after_the_commit() -> None:
    """A row written in a savepoint has a transaction id of its own: a row held behind it is
    released by its publisher after the commit, as behind another transaction's row."""
    with transaction.atomic():
        with transaction.atomic():
            first = keyed("order-8", 1)
        later = keyed("order-8", 2)
        assert [release.keys for release in _releases()] == [{"order-8"}]
    assert due_rows("order-8") == first
    _sent_in_order("order-8", first + later)


def test_a_rolled_back_publish_releases_nothing() -> None:
    (first,) = keyed("k", 1)
    with pytest.raises(RuntimeError), transaction.atomic():
        keyed("k", 1)
        raise RuntimeError("the business transaction fails")
    assert list(OutboxMessage.objects.values_list("message_id", flat=True)) == [first]


@pytest.mark.postgres
def test_the_sweep_handles_more_keys_than_a_statement_takes_parameters() -> None:
    """After a long broker outage with one key per order, more keys may have held rows than
    PostgreSQL takes bound parameters (65,535, under Django's server-side binding): the sweep
    goes by chunks."""
    keys = 66_000
    with connection.cursor() as cursor:  # each key's only pending row, held (as by a race)
        cursor.execute(
            f"INSERT INTO {TABLE} ({COLUMNS}) SELECT 'm' || g, 'e', '{{}}', '{{}}', '', 'q', "
            "'key-' || g, 'pending', 0, '', now(), now(), NULL, '', '', '' "
            f"FROM generate_series(1, {keys}) g"
        )
    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["server_side_binding"] = True
    try:
        assert relay_rows.sweep("default") == keys
    finally:
        connection.close()
        options.pop("server_side_binding", None)
    assert not OutboxMessage.objects.filter(next_attempt_at__isnull=True).exists()


def test_a_replay_of_many_dead_rows_of_one_key_holds_all_but_the_oldest() -> None:
    """Dead rows pile up on a key while its queue is missing; replayed, they must not all be
    due at once for every claim to read past."""
    ids = keyed("hot", 300)
    OutboxMessage.objects.update(status=Status.DEAD, next_attempt_at=None, attempts=10)
    later = keyed("hot", 1)  # written after the failures
    assert due_rows("hot") == later
    assert services.replay(OutboxMessage.objects.filter(status=Status.DEAD)) == 300
    # The oldest replayed row is the key's oldest pending row again: due, the rest held.
    assert due_rows("hot") == [ids[0], *later]
    lease, claimed = relay_rows.claim(100, "default")
    assert [row.message_id for row in claimed] == ids[:1]  # the later row waits for it
    relay_rows.mark_sent([row.pk for row in claimed], lease, "default", ["hot"])
    assert due_rows("hot") == [ids[1], *later]  # released in order, one at a time
    if connection.vendor == "postgresql":
        take_statistics(TABLE)
        with CaptureQueriesContext(connection) as queries:
            relay_rows.claim(100, "default")
        claim_sql = next(q["sql"] for q in queries if "SKIP LOCKED" in q["sql"])
        OutboxMessage.objects.update(locked_until=None)
        plan = explain(claim_sql, analyze=True)
        assert rows_read(plan) <= 60, json.dumps(plan, indent=1)


@contextmanager
def logged(name: str, caplog: pytest.LogCaptureFixture) -> Iterator[list[logging.LogRecord]]:
    """The records ``name`` logs at ERROR here, whatever earlier tests in this process did
    to logging (a handler on the logger itself: no propagation, level or disabling)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    disabled, logger.disabled = logger.disabled, False
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.ERROR, logger=name):
            yield records
    finally:
        logger.removeHandler(handler)
        logger.disabled = disabled


@pytest.mark.postgres
def test_a_relay_goes_on_when_its_sweep_fails(caplog: pytest.LogCaptureFixture) -> None:
    """A sweep that fails (here a lock timeout: another session holds the held row) is
    logged; the relay doesn't stop claiming, and a later sweep releases the row."""
    from django_inbox.outbox.relay import Relay

    first, second = keyed("k", 2)
    OutboxMessage.objects.filter(message_id=first).update(status=Status.SENT)  # no release
    locked, done = threading.Event(), threading.Event()

    def hold_the_row() -> None:
        try:
            with transaction.atomic():
                list(OutboxMessage.objects.select_for_update().filter(message_id=second))
                locked.set()
                done.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_row)
    holder.start()
    try:
        assert locked.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '50ms'")
        relay = Relay("amqp://unused")
        with logged("django_inbox.outbox", caplog) as records:
            relay._sweep()  # logged, not raised
    finally:
        done.set()
        holder.join()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert due_rows("k") == []  # the sweep failed...
    assert any("the sweep for held rows failed" in r.getMessage() for r in records)  # ...said so
    relay._swept_at = None  # the next sweep is due
    relay._sweep()
    assert due_rows("k") == [second]
