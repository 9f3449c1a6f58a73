"""``purge()`` / ``inbox_purge``: only finished rows past their retention are ever deleted.

The scale test fills the real PostgreSQL table with a million completed rows and purges half
of them with the real command while a real worker processes a stream of new messages; the
unit tests pin down which rows each retention selects. Every test counts what is left.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import threading
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from django_inbox import Outcome, deliver
from django_inbox.models import InboxMessage
from django_inbox.services.purge import PurgeProgress, expired, purge
from tests.effects import effect_counts

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]
DAY = 86400.0
NEVER_PURGED = (Status.RECEIVED, Status.IN_PROGRESS, Status.FAILED, Status.PARKED)


def make(consumer: str, status: str, age: float, message_id: str | None = None) -> InboxMessage:
    """A row of ``status`` whose every timestamp is ``age`` seconds old.

    ``processed_at`` is set whatever the status (a replayed row keeps its old one), so only
    the status can keep a pending row from being purged.
    """
    at = timezone.now() - timedelta(seconds=age)
    return InboxMessage.objects.create(
        consumer=consumer,
        message_id=message_id or f"{consumer}-{status}-{age:g}",
        event_type="effect.write",
        payload={},
        status=status,
        attempts=1,
        received_at=at,
        updated_at=at,
        next_attempt_at=at,
        locked_until=at if status == Status.IN_PROGRESS else None,
        processed_at=at,
    )


def left(**filters: Any) -> set[str]:
    return set(InboxMessage.objects.filter(**filters).values_list("message_id", flat=True))


def ids(rows: Any) -> set[str]:
    return set(rows.values_list("message_id", flat=True))


def purge_command(*args: str) -> str:
    out = StringIO()
    call_command("inbox_purge", *args, stdout=out)
    return out.getvalue()


# --- 1. at scale: a million rows, the real command, a real worker at the same time -----------

BULK = 1_000_000
PENDING_EACH = 1_000
LIVE_MIN, LIVE_MAX = 2_000, 20_000
BULK_SQL = """
INSERT INTO django_inbox_inboxmessage
    (consumer, message_id, source, event_type, key, payload, headers, status, attempts,
     last_error, history, received_at, updated_at, next_attempt_at, locked_until, lease_id,
     processed_at)
SELECT (ARRAY['effects', 'legacy', 'stream'])[1 + i %% 3], 'bulk-' || i, '', 'effect.write', '',
       '{}'::jsonb, '{}'::jsonb, 'completed', 1, '', '[]'::jsonb, at, at, NULL, NULL, '', at
FROM (
    SELECT i, CASE WHEN i %% 2 = 0
                   THEN now() - interval '40 days' - (i %% 10000) * interval '1 minute'
                   ELSE now() - interval '20 days' + (i %% 10000) * interval '1 minute'
              END AS at
    FROM generate_series(1, %s) AS i
) AS bulk
"""
# Rows a purge must never touch however old they are (dead: only with a dead retention).
PENDING_SQL = """
INSERT INTO django_inbox_inboxmessage
    (consumer, message_id, source, event_type, key, payload, headers, status, attempts,
     last_error, history, received_at, updated_at, next_attempt_at, locked_until, lease_id,
     processed_at)
SELECT 'legacy', %s::text || '-' || i, '', 'effect.write', '', '{}'::jsonb, '{}'::jsonb, %s, 1,
       '', '[]'::jsonb, at, at, at, at, '', at
FROM (SELECT i, now() - interval '400 days' - i * interval '1 second' AS at
      FROM generate_series(1, %s) AS i) AS old
"""
SUMMARY = re.compile(
    r"inbox_purge: deleted ([\d,]+) completed in ([\d,]+) batches, ([\d.]+)s "
    r"\(([\d,]+) rows/s\)"
)


def bulk_counts() -> tuple[int, int]:
    """(expired, recent) bulk completed rows: even numbers are 40+ days old, odd under 21."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE processed_at < now() - interval '30 days'), "
            "count(*) FILTER (WHERE processed_at >= now() - interval '30 days') "
            "FROM django_inbox_inboxmessage WHERE status = 'completed' AND message_id LIKE %s",
            ["bulk-%"],
        )
        expired_rows, recent_rows = cursor.fetchone()
    return expired_rows, recent_rows


# --- 2. a duplicate arriving after its row was purged is processed again -----------------------


def deliver_effect(message_id: str) -> Outcome:
    return deliver(consumer="effects", message_id=message_id, event_type="effect.write", payload={})


@pytest.mark.django_db(transaction=True)
def test_duplicate_after_purge_is_parked_by_its_tombstone() -> None:
    assert deliver_effect("m") == Outcome.PROCESSED
    assert deliver_effect("m") == Outcome.DUPLICATE  # the row remembers it...
    assert effect_counts() == {"m": 1}

    output = purge_command("--older-than", "0")

    assert "deleted 1 completed" in output, output
    assert "kept 1 tombstone" in output, output
    assert not InboxMessage.objects.exists()
    # ...and once it is purged, its tombstone: the copy is parked, not run again.
    assert deliver_effect("m") == Outcome.PARKED
    assert effect_counts() == {"m": 1}
    assert InboxMessage.objects.get().status == Status.PARKED


@pytest.mark.django_db(transaction=True)
@override_settings(INBOX_TOMBSTONE_RETENTION=None)
def test_duplicate_after_purge_without_tombstones_is_processed_again() -> None:
    assert deliver_effect("m") == Outcome.PROCESSED
    output = purge_command("--older-than", "0")
    assert "deleted 1 completed" in output and "tombstone" not in output, output
    # Without a tombstone the same message is new again, as documented.
    assert deliver_effect("m") == Outcome.PROCESSED
    assert effect_counts() == {"m": 2}
    assert InboxMessage.objects.get().status == Status.COMPLETED


@pytest.mark.django_db(transaction=True)
def test_duplicate_within_retention_is_still_a_duplicate_after_a_purge() -> None:
    assert deliver_effect("kept") == Outcome.PROCESSED
    assert purge().total == 0  # processed just now: well within INBOX_RETENTION
    assert deliver_effect("kept") == Outcome.DUPLICATE
    assert effect_counts() == {"kept": 1}


# --- 3. which rows expire ------------------------------------------------------------------------


@pytest.mark.django_db
@override_settings(
    INBOX_RETENTION="30d",
    INBOX_CONSUMERS={"short": {"retention": "1d"}, "long": {"retention": "90d"}, "plain": {}},
)
def test_each_consumer_retention_over_the_global_one() -> None:
    make("short", Status.COMPLETED, 2 * DAY, "short-2d")  # past its own 1 day
    make("short", Status.COMPLETED, DAY / 2, "short-12h")
    make("long", Status.COMPLETED, 60 * DAY, "long-60d")  # within its own 90 days
    make("long", Status.COMPLETED, 100 * DAY, "long-100d")
    make("plain", Status.COMPLETED, 40 * DAY, "plain-40d")  # configured, inherits 30 days
    make("plain", Status.COMPLETED, 20 * DAY, "plain-20d")
    make("other", Status.COMPLETED, 40 * DAY, "other-40d")  # not configured: 30 days
    make("other", Status.COMPLETED, 20 * DAY, "other-20d")
    gone = {"short-2d", "long-100d", "plain-40d", "other-40d"}

    assert ids(expired(Status.COMPLETED)) == gone
    assert ids(expired(Status.COMPLETED, consumer="short")) == {"short-2d"}
    assert ids(expired(Status.COMPLETED, consumer="long")) == {"long-100d"}
    assert ids(expired(Status.COMPLETED, consumer="other")) == {"other-40d"}
    assert ids(expired(Status.COMPLETED, older_than=50 * DAY)) == {"long-60d", "long-100d"}

    result = purge()

    assert result.deleted == {Status.COMPLETED: 4}
    assert result.skipped == [Status.DEAD]
    assert left() == {"short-12h", "long-60d", "plain-20d", "other-20d"}


@pytest.mark.django_db
@pytest.mark.parametrize("consumers", [{}, None])
def test_global_retention_without_any_consumer_policy(consumers: object) -> None:
    make("effects", Status.COMPLETED, 40 * DAY, "old")
    make("other", Status.COMPLETED, 40 * DAY, "other-old")
    make("effects", Status.COMPLETED, 20 * DAY, "recent")

    with override_settings(INBOX_CONSUMERS=consumers, INBOX_RETENTION="30d"):
        assert ids(expired(Status.COMPLETED)) == {"old", "other-old"}
        assert purge().deleted == {Status.COMPLETED: 2}
    assert left() == {"recent"}


@pytest.mark.django_db
@override_settings(INBOX_RETENTION="1s", INBOX_DEAD_RETENTION="1s")
def test_pending_and_parked_rows_are_never_purged_however_old() -> None:
    for status in NEVER_PURGED:
        make("effects", status, 3650 * DAY)
        make("other", status, 3650 * DAY)
    make("effects", Status.COMPLETED, 3650 * DAY, "done")
    make("effects", Status.DEAD, 3650 * DAY, "dead")

    result = purge()
    again = purge(older_than=0)

    assert result.deleted == {Status.COMPLETED: 1, Status.DEAD: 1}
    assert again.total == 0
    assert left() == {f"{c}-{s}-{3650 * DAY:g}" for c in ("effects", "other") for s in NEVER_PURGED}
    assert set(InboxMessage.objects.values_list("status", flat=True)) == set(NEVER_PURGED)


@pytest.mark.django_db
def test_dead_rows_are_kept_without_a_dead_retention() -> None:
    make("effects", Status.DEAD, 3650 * DAY, "ancient-dead")
    make("effects", Status.COMPLETED, 40 * DAY, "old-done")

    assert expired(Status.DEAD) is None
    assert expired(Status.DEAD, consumer="effects") is None
    result = purge()

    assert result.skipped == [Status.DEAD]
    assert result.deleted == {Status.COMPLETED: 1}
    assert left() == {"ancient-dead"}
    output = purge_command()
    assert "dead rows kept" in output and "INBOX_DEAD_RETENTION" in output, output
    assert left() == {"ancient-dead"}


@pytest.mark.django_db
@override_settings(INBOX_DEAD_RETENTION="7d")
def test_global_dead_retention() -> None:
    make("effects", Status.DEAD, 10 * DAY, "dead-10d")
    make("other", Status.DEAD, 10 * DAY, "other-dead-10d")
    make("effects", Status.DEAD, 3 * DAY, "dead-3d")
    make("effects", Status.COMPLETED, 10 * DAY, "done-10d")  # within the 30 day retention

    result = purge()

    assert result.deleted == {Status.COMPLETED: 0, Status.DEAD: 2}
    assert result.skipped == []
    assert left() == {"dead-3d", "done-10d"}


@pytest.mark.django_db
@override_settings(
    INBOX_DEAD_RETENTION=None,
    INBOX_CONSUMERS={"brief": {"dead_retention": "1d"}, "plain": {}},
)
def test_a_consumer_dead_retention_purges_only_its_dead_rows() -> None:
    make("brief", Status.DEAD, 2 * DAY, "brief-2d")
    make("brief", Status.DEAD, DAY / 2, "brief-12h")
    make("plain", Status.DEAD, 3650 * DAY, "plain-old")
    make("other", Status.DEAD, 3650 * DAY, "other-old")

    assert ids(expired(Status.DEAD)) == {"brief-2d"}
    assert expired(Status.DEAD, consumer="plain") is None
    result = purge()

    assert result.deleted == {Status.COMPLETED: 0, Status.DEAD: 1}
    assert left() == {"brief-12h", "plain-old", "other-old"}


@pytest.mark.django_db
@override_settings(INBOX_DEAD_RETENTION="1d", INBOX_CONSUMERS={"keeper": {"dead_retention": None}})
def test_a_consumer_may_keep_its_dead_rows_despite_a_global_dead_retention() -> None:
    make("keeper", Status.DEAD, 3650 * DAY, "keeper-old")
    make("other", Status.DEAD, 2 * DAY, "other-2d")

    assert purge().deleted[Status.DEAD] == 1
    assert left() == {"keeper-old"}


@pytest.mark.django_db
def test_older_than_applies_to_dead_rows_only_when_they_are_named() -> None:
    make("effects", Status.DEAD, 10 * DAY, "dead-10d")
    make("effects", Status.DEAD, 3 * DAY, "dead-3d")
    make("effects", Status.COMPLETED, 10 * DAY, "done-10d")  # within INBOX_RETENTION
    make("effects", Status.COMPLETED, 3 * DAY, "done-3d")

    # An age for completed rows never deletes dead letters nobody has looked at.
    result = purge(older_than=5 * DAY)
    assert result.deleted == {Status.COMPLETED: 1}
    assert result.skipped == [Status.DEAD]
    assert left() == {"dead-10d", "dead-3d", "done-3d"}
    assert "dead rows kept" in purge_command("--older-than", "1d")
    assert left() == {"dead-10d", "dead-3d"}

    result = purge(statuses=(Status.COMPLETED, Status.DEAD), older_than=5 * DAY)
    assert result.deleted == {Status.COMPLETED: 0, Status.DEAD: 1}
    assert left() == {"dead-3d"}
    output = purge_command("--older-than", "1d", "--status", "completed", "--status", "dead")
    assert "deleted 0 completed, 1 dead" in output
    assert not InboxMessage.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("status", NEVER_PURGED)
def test_purge_and_expired_refuse_statuses_that_are_never_purged(status: str) -> None:
    make("effects", status, 3650 * DAY, "pending")
    make("effects", Status.COMPLETED, 3650 * DAY, "done")

    with pytest.raises(ValueError, match="can be purged"):
        purge(statuses=(status,))
    with pytest.raises(ValueError, match="can be purged"):
        expired(status, older_than=0)
    # Refused before anything is deleted, even when listed after a purgeable status.
    with pytest.raises(ValueError, match="can be purged"):
        purge(statuses=(Status.COMPLETED, status), older_than=0)
    with pytest.raises(ValueError, match="can be purged"):
        purge(statuses=(Status.COMPLETED, status), dry_run=True)
    with pytest.raises(CommandError, match="never purged"):
        purge_command("--status", status)

    assert left() == {"pending", "done"}


@pytest.mark.django_db
def test_consumer_option_limits_the_purge() -> None:
    for consumer in ("a", "b", "c"):
        make(consumer, Status.COMPLETED, 40 * DAY, f"{consumer}-old")
        make(consumer, Status.DEAD, 40 * DAY, f"{consumer}-dead")

    both = (Status.COMPLETED, Status.DEAD)
    assert purge(statuses=both, consumer="a", older_than=DAY).deleted == {
        Status.COMPLETED: 1,
        Status.DEAD: 1,
    }
    assert left() == {"b-old", "b-dead", "c-old", "c-dead"}
    output = purge_command("--consumer", "b")
    assert "deleted 1 completed" in output, output
    assert left() == {"b-dead", "c-old", "c-dead"}
    with pytest.raises(CommandError) as typo:  # a consumer nobody knows: a typo, exit 2
        purge_command("--consumer", "nobody", "--older-than", "0")
    assert typo.value.returncode == 2
    assert left() == {"b-dead", "c-old", "c-dead"}


@pytest.mark.django_db
def test_dry_run_deletes_nothing_and_counts_what_would_go() -> None:
    for n in range(3):
        make("effects", Status.COMPLETED, 40 * DAY, f"old-{n}")
    make("effects", Status.COMPLETED, DAY, "recent")
    make("effects", Status.DEAD, 40 * DAY, "dead-old")
    make("effects", Status.DEAD, DAY, "dead-recent")
    before = left()

    result = purge(dry_run=True)
    assert result.dry_run is True
    assert (result.deleted, result.skipped, result.batches) == ({Status.COMPLETED: 3}, ["dead"], 0)
    both = (Status.COMPLETED, Status.DEAD)
    result = purge(statuses=both, dry_run=True, older_than=10 * DAY, batch_size=1)
    assert result.deleted == {Status.COMPLETED: 3, Status.DEAD: 1}
    assert result.total == 4
    output = purge_command("--dry-run", "--older-than", "10d")
    assert "would delete 3 completed" in output and "dead rows kept" in output, output
    output = purge_command(
        "--dry-run", "--status", "completed", "--status", "dead", "--older-than", "10d"
    )
    assert "would delete 3 completed, 1 dead" in output, output
    output = purge_command("--dry-run", "--status", "dead", "--older-than", "0")
    assert "would delete 2 dead" in output, output

    assert left() == before
    assert purge(statuses=both, older_than=10 * DAY).total == 4  # what the dry runs announced


@pytest.mark.django_db
def test_batches_and_progress() -> None:
    for n in range(50):
        make("effects", Status.COMPLETED, 40 * DAY, f"old-{n}")
    for n in range(5):
        make("effects", Status.COMPLETED, DAY, f"recent-{n}")
    seen: list[PurgeProgress] = []

    result = purge(batch_size=7, progress=seen.append)

    assert result.deleted == {Status.COMPLETED: 50}
    assert result.batches == 8  # 7 full batches and one of 1
    assert [p.deleted for p in seen] == [7, 14, 21, 28, 35, 42, 49, 50]
    assert [p.batches for p in seen] == list(range(1, 9))
    assert all(a.elapsed <= b.elapsed for a, b in itertools.pairwise(seen))
    assert result.elapsed >= seen[-1].elapsed
    assert left() == {f"recent-{n}" for n in range(5)}


@pytest.mark.django_db
def test_batch_size_must_be_positive() -> None:
    make("effects", Status.COMPLETED, 40 * DAY, "old")
    with pytest.raises(ValueError, match="batch_size"):
        purge(batch_size=0)
    with pytest.raises(CommandError, match="--batch-size"):
        purge_command("--batch-size", "0")
    assert left() == {"old"}


@pytest.mark.django_db
def test_command_summary_line() -> None:
    for n in range(12):
        make("effects", Status.COMPLETED, 40 * DAY, f"old-{n}")

    output = purge_command("--batch-size", "5")

    summary = r"deleted 12 completed in 3 batches, [\d.]+s \([\d,]+ rows/s\)"
    assert re.search(summary, output), output
    assert purge_command("-v", "0") == ""
    assert "deleted 0 completed in 0 batches" in purge_command()
    make("effects", Status.COMPLETED, 40 * DAY, "old-one")
    assert "deleted 1 completed in 1 batch, " in purge_command()


@pytest.mark.server_db
@pytest.mark.django_db(transaction=True)
def test_a_locked_completed_row_is_skipped_not_waited_for() -> None:
    rows = [make("effects", Status.COMPLETED, 40 * DAY, f"old-{n}") for n in range(5)]
    locked, release = threading.Event(), threading.Event()
    outcome: dict[str, bool] = {}

    def hold_lock() -> None:
        try:
            with transaction.atomic():
                list(InboxMessage.objects.select_for_update().filter(pk=rows[2].pk))
                locked.set()
                outcome["released_by_test"] = release.wait(timeout=60)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_lock, daemon=True)
    holder.start()
    assert locked.wait(timeout=30)
    try:
        result = purge(batch_size=2)
    finally:
        release.set()
        holder.join(timeout=90)

    # Had purge waited for the lock it would have returned only after the holder gave up.
    assert outcome == {"released_by_test": True}
    assert result.deleted == {Status.COMPLETED: 4}
    assert result.batches == 2  # rows 1-2, then 4-5: the batches went on past the locked row
    assert left() == {"old-2"}
    assert purge().deleted == {Status.COMPLETED: 1}  # the next run takes it
    assert not InboxMessage.objects.exists()
