"""Late copies after purge: a purged completed message's tombstone parks a copy that arrives
later, by every way in (``deliver()``, ``store()``, a batch, a broker's redelivery), on every
database; a purge racing the copy never lets it run twice (PostgreSQL's trigger waits for the
purge); tombstones expire with their own retention.

Every test counts the effects the ``effects`` consumer's handler committed.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_inbox import Outcome, deliver, store
from django_inbox.db import tombstones
from django_inbox.db.identity import digest_sql
from django_inbox.intake.batches import deliver_batch
from django_inbox.intake.rows import prepare
from django_inbox.models import InboxMessage, InboxTombstone
from django_inbox.services import process_due
from django_inbox.services.operator import replay
from django_inbox.services.purge import purge
from tests.effects import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
DAY = 86400.0


def message(message_id: str, **extra: object) -> dict[str, object]:
    return {
        "consumer": "effects",
        "message_id": message_id,
        "event_type": "effect.write",
        "payload": {"n": 1},
        **extra,
    }


def completed_and_purged(*message_ids: str) -> None:
    """Deliver each message once, age its row past the retention, and purge it."""
    for message_id in message_ids:
        assert deliver(**message(message_id)) == Outcome.PROCESSED
    old = timezone.now() - timedelta(days=40)
    InboxMessage.objects.filter(message_id__in=message_ids).update(processed_at=old)
    result = purge()
    assert result.deleted["completed"] == len(message_ids)
    assert result.tombstones_written == len(message_ids)
    assert not InboxMessage.objects.filter(message_id__in=message_ids).exists()


def assert_parked_late(message_id: str) -> InboxMessage:
    row = InboxMessage.objects.get(consumer="effects", message_id=message_id)
    assert row.status == Status.PARKED
    assert row.attempts == 0 and row.processed_at is None and row.next_attempt_at is None
    assert "completed on " in row.last_error and "purged on " in row.last_error
    assert row.history[-1]["type"] == "LateCopy"
    return row


def test_a_late_copy_of_a_purged_message_is_parked_not_run() -> None:
    completed_and_purged("late-1")
    stone = InboxTombstone.objects.get(digest=tombstones.digest("effects", "late-1"))
    assert stone.expires_at - stone.purged_at == timedelta(days=30)

    assert deliver(**message("late-1")) == Outcome.PARKED
    assert deliver(**message("late-1")) == Outcome.PARKED  # and a copy of the copy
    assert effect_counts() == {"late-1": 1}
    row = assert_parked_late("late-1")
    assert str(stone.purged_at.date()) in row.last_error
    # A worker never runs it; an operator's replay does, once, knowingly.
    assert process_due(["effects"], max_messages=None).outcomes == {}
    assert effect_counts() == {"late-1": 1}
    replay(InboxMessage.objects.filter(pk=row.pk), actor="ops")
    assert process_due(["effects"], max_messages=None).outcomes == {"processed": 1}
    assert effect_counts() == {"late-1": 2}


def test_store_a_batch_and_a_redelivery_park_late_copies_too() -> None:
    completed_and_purged("late-s", "late-b", "late-r")

    assert store(**message("late-s")) is True  # kept (parked), so the sender may ack it
    outcomes = deliver_batch([prepare(**message(m)) for m in ("new-b1", "late-b", "new-b2")])
    assert outcomes == [Outcome.PROCESSED, Outcome.PARKED, Outcome.PROCESSED]
    assert deliver(**message("late-r"), redelivered=True) == Outcome.PARKED
    assert process_due(["effects"], max_messages=None).outcomes == {}

    for message_id in ("late-s", "late-b", "late-r"):
        assert_parked_late(message_id)
    assert effect_counts() == {"late-s": 1, "late-b": 1, "late-r": 1, "new-b1": 1, "new-b2": 1}


def test_a_late_copy_inside_the_callers_transaction_keeps_that_transaction() -> None:
    completed_and_purged("late-t")
    with transaction.atomic():
        assert deliver(**message("late-t")) == Outcome.PARKED
        assert deliver(**message("fresh-t")) == Outcome.PROCESSED
    assert_parked_late("late-t")
    assert effect_counts() == {"late-t": 1, "fresh-t": 1}


def test_without_a_tombstone_retention_a_late_copy_runs_again() -> None:
    with override_settings(INBOX_TOMBSTONE_RETENTION=None):
        assert deliver(**message("gone-1")) == Outcome.PROCESSED
        InboxMessage.objects.update(processed_at=timezone.now() - timedelta(days=40))
        result = purge()
        assert result.deleted["completed"] == 1 and result.tombstones_written == 0
        assert deliver(**message("gone-1")) == Outcome.PROCESSED
    assert effect_counts() == {"gone-1": 2}  # what the docs say: no tombstone, no memory


def test_a_consumers_own_tombstone_retention_applies() -> None:
    consumers = {"effects": {"tombstone_retention": 2 * DAY}}
    with override_settings(INBOX_CONSUMERS=consumers):
        completed_and_purged("own-1")
        stone = InboxTombstone.objects.get()
        assert stone.expires_at - stone.purged_at == timedelta(days=2)
    with override_settings(INBOX_CONSUMERS={"effects": {"tombstone_retention": None}}):
        assert deliver(**message("own-2")) == Outcome.PROCESSED
        InboxMessage.objects.update(processed_at=timezone.now() - timedelta(days=40))
        assert purge(dry_run=True).tombstones_written == 0
        assert purge().tombstones_written == 0
    assert InboxTombstone.objects.count() == 1


def test_dead_rows_leave_no_tombstone_and_a_dead_copy_stays_dead() -> None:
    completed_and_purged("late-d")
    row = InboxMessage.objects.create(
        consumer="effects",
        message_id="dead-1",
        event_type="effect.write",
        payload={},
        status=Status.DEAD,
        updated_at=timezone.now() - timedelta(days=40),
    )
    assert purge(statuses=("dead",), older_than=DAY).deleted["dead"] == 1
    assert not InboxTombstone.objects.filter(digest=tombstones.digest("effects", row.message_id))
    # store_dead() of a late copy keeps it dead: it runs nothing either way.
    from django_inbox import store_dead

    assert store_dead(**message("late-d"), reason="unreadable") is True
    assert InboxMessage.objects.get(message_id="late-d").status == Status.DEAD


def test_expired_tombstones_are_purged_and_the_command_says_so() -> None:
    completed_and_purged("exp-1", "exp-2")
    InboxTombstone.objects.filter(digest=tombstones.digest("effects", "exp-1")).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    out = StringIO()
    call_command("inbox_purge", "--dry-run", stdout=out)
    assert "would delete 1 expired tombstone" in out.getvalue()
    assert InboxTombstone.objects.count() == 2
    out = StringIO()
    call_command("inbox_purge", "--batch-size", "1", stdout=out)
    assert "deleted 1 expired tombstone" in out.getvalue()
    assert list(InboxTombstone.objects.values_list("digest", flat=True)) == [
        tombstones.digest("effects", "exp-2")
    ]
    # The expired one no longer parks its copy; the kept one does.
    assert deliver(**message("exp-1")) == Outcome.PROCESSED
    assert deliver(**message("exp-2")) == Outcome.PARKED
    assert effect_counts() == {"exp-1": 2, "exp-2": 1}


def test_purging_again_after_a_replayed_late_copy_renews_its_tombstone() -> None:
    completed_and_purged("again-1")
    first = InboxTombstone.objects.get()
    assert deliver(**message("again-1")) == Outcome.PARKED
    replay(InboxMessage.objects.filter(message_id="again-1"), actor="ops")
    process_due(["effects"], max_messages=None)
    InboxMessage.objects.update(processed_at=timezone.now() - timedelta(days=40))
    assert purge().tombstones_written == 1
    renewed = InboxTombstone.objects.get()
    assert renewed.purged_at > first.purged_at and renewed.completed_at > first.completed_at


def test_a_late_copy_is_parked_in_its_inserts_transaction() -> None:
    """Off PostgreSQL the inbox parks the row after its insert: both in one transaction (its
    own, outside the caller's), so that no worker can claim the row in between. On PostgreSQL
    the trigger parks it inside the insert, and the reason follows."""
    completed_and_purged("late-a")
    parks: list[bool] = []

    def watch(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        if sql.lstrip().upper().startswith("UPDATE") and "inboxmessage" in sql:
            parks.append(connection.in_atomic_block)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(watch):
        assert store(**message("late-a")) is True
    assert_parked_late("late-a")
    assert parks == [connection.vendor != "postgresql"], parks


def test_tombstones_of_any_ids_are_kept_on_every_database() -> None:
    """Digests are UUIDs of version 4 (MariaDB's ``uuid`` column refuses some other values):
    a thousand purged ids, of every shape, all keep their tombstone and park their copy."""
    now = timezone.now()
    ids = [f"{k}-{'é' * (k % 3)}{chr(0x1F9FE) * (k % 2)}" for k in range(1000)]
    keep = tombstones.Keeping.at(now)
    assert tombstones.write([("effects", i, now) for i in ids], keep, "default") == 1000
    assert InboxTombstone.objects.count() == 1000
    assert {stone.version for stone in InboxTombstone.objects.values_list("digest", flat=True)} == {
        4
    }
    assert deliver(**message(ids[-1])) == Outcome.PARKED


@pytest.mark.postgres
def test_the_digest_is_the_one_the_trigger_computes() -> None:
    pairs = [
        ("effects", "late-1"),
        ("a\\b", "c\\\\d"),
        ("évt", "ÉVT-1 "),
        ("🧾", "\U0001d518\u0301"),
        ("12:3", "4"),
        ("1", "2:34"),
    ]
    with connection.cursor() as cursor:
        for consumer, message_id in pairs:
            cursor.execute("SELECT django_inbox_tombstone_digest(%s, %s)", [consumer, message_id])
            stone = cursor.fetchone()[0]
            assert stone == tombstones.digest(consumer, message_id)
            assert stone.version == 4 and stone.variant == uuid.RFC_4122
            # The identity's first 122 bits: what the index of identities holds, but for the
            # version and variant bits.
            cursor.execute(f"SELECT {digest_sql('%s', '%s')}", [consumer, consumer, message_id])
            identity = cursor.fetchone()[0].int
            mask = ~((0xF << 76) | (0x3 << 62)) & ((1 << 128) - 1)
            assert stone.int & mask == identity & mask


@pytest.mark.postgres
def test_a_copy_arriving_while_the_purge_deletes_its_row_waits_for_it_and_is_parked() -> None:
    """The purge's transaction (its advisory lock taken, as ``delete_selected`` does) has
    deleted the row and written the tombstone, uncommitted; the copy's insert must wait for it
    and then see the tombstone. Without the trigger's wait the insert would wait at the unique
    index instead, then go in as new and run again."""
    import psycopg
    from django.conf import settings

    assert deliver(**message("race-1")) == Outcome.PROCESSED
    row = InboxMessage.objects.get(message_id="race-1")
    table, stones = InboxMessage._meta.db_table, InboxTombstone._meta.db_table
    db = settings.DATABASES["default"]
    purger = psycopg.connect(
        host=db["HOST"], port=db["PORT"] or 5432, user=db["USER"], dbname=db["NAME"]
    )
    purger.execute("SELECT pg_advisory_xact_lock(%s)", [tombstones.PURGE_LOCK])  # as a purge
    purger.execute(f"DELETE FROM {table} WHERE id = %s", [row.pk])
    purger.execute(
        f"INSERT INTO {stones} (digest, completed_at, purged_at, expires_at) "
        "VALUES (%s, %s, now(), now() + interval '1 day')",
        [tombstones.digest("effects", "race-1"), row.processed_at],
    )
    outcome: list[Outcome] = []
    copy = in_thread(lambda: outcome.append(deliver(**message("race-1"))))
    try:
        # The copy is waiting for the purge's transaction (a lock, seen by PostgreSQL).
        waited = _wait_for_lock_waiters(purger, 1)
        assert waited, "the copy did not wait for the purge's transaction"
    finally:
        purger.commit()
        purger.close()
        copy.join(timeout=30)
    assert outcome == [Outcome.PARKED]
    assert_parked_late("race-1")
    assert effect_counts() == {"race-1": 1}


def in_thread(work: Callable[[], object]) -> threading.Thread:
    """``work`` in a thread of its own, on its own database connection, closed after."""

    def run() -> None:
        try:
            work()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _wait_for_lock_waiters(conn: object, n: int, timeout: float = 20.0) -> bool:
    import psycopg

    assert isinstance(conn, psycopg.Connection)
    with psycopg.connect(conn.info.dsn, autocommit=True) as watcher:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            ).fetchone()
            if found and found[0] >= n:
                return True
            time.sleep(0.02)
    return False


@pytest.mark.postgres
def test_a_purge_that_comes_while_a_copy_is_answered_waits_for_it() -> None:
    """A duplicate's transaction holds the trigger's shared lock until it ends; a purge of
    completed rows that starts meanwhile waits for it, then deletes the row and keeps its
    tombstone, and the next copy is parked."""
    assert deliver(**message("held-1")) == Outcome.PROCESSED
    InboxMessage.objects.update(processed_at=timezone.now() - timedelta(days=40))
    result: list[int] = []
    with transaction.atomic():
        assert deliver(**message("held-1")) == Outcome.DUPLICATE
        purging = in_thread(lambda: result.append(purge().total))
        waited = _wait_for_lock_waiters(connection.connection, 1)  # type: ignore[arg-type]
        assert result == [] and purging.is_alive()
    purging.join(timeout=30)
    assert waited, "the purge did not wait for the duplicate's transaction"
    assert result == [1]
    assert deliver(**message("held-1")) == Outcome.PARKED
    assert effect_counts() == {"held-1": 1}
