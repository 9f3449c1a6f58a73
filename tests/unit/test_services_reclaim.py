"""``inbox_reclaim``: rows of workers that died (SIGKILL) or hang (SIGSTOP) come back, once.

The process-based tests use real ``manage.py`` workers on PostgreSQL and end by counting
committed effects (lost = 0, doubled = 0). The rule tests set stuck rows up directly in the
database and run the command in-process, on any database.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection
from django.utils import timezone

from django_inbox import store
from django_inbox.models import InboxMessage

Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]
RECLAIMED = re.compile(
    r"inbox_reclaim: (?:would reclaim|reclaimed) (\d+) row\(s\): (\d+) failed .*?, (\d+) dead, "
    r"(\d+) released"
)
#: Columns reclaim may change; a row it must leave alone keeps all of them.
SNAPSHOT = (
    "status",
    "attempts",
    "history",
    "last_error",
    "lease_id",
    "locked_until",
    "next_attempt_at",
    "updated_at",
)


def store_effect(message_id: str, **payload: object) -> InboxMessage:
    assert store(
        consumer="effects", message_id=message_id, event_type="effect.write", payload=payload
    )
    return InboxMessage.objects.get(consumer="effects", message_id=message_id)


def stuck(
    message_id: str,
    *,
    attempts: int = 1,
    lease_id: str | None = None,
    claimed_ago: float = 60.0,
    expires_in: float = -30.0,
) -> InboxMessage:
    """A row left ``in_progress`` by a claim ``claimed_ago`` seconds ago (lease expired)."""
    row = store_effect(message_id)
    now = timezone.now()
    until = now + timedelta(seconds=expires_in)
    InboxMessage.objects.filter(pk=row.pk).update(
        status=Status.IN_PROGRESS,
        attempts=attempts,
        lease_id=lease_id or uuid.uuid4().hex,
        locked_until=until,
        next_attempt_at=until,
        updated_at=now - timedelta(seconds=claimed_ago),
    )
    row.refresh_from_db()
    return row


def snapshot(row: InboxMessage) -> dict[str, Any]:
    return dict(InboxMessage.objects.filter(pk=row.pk).values(*SNAPSHOT).get())


def reclaim(*args: str) -> tuple[str, tuple[int, int, int, int]]:
    """Run ``inbox_reclaim`` in-process; return its output and (total, failed, dead, released)."""
    out = StringIO()
    call_command("inbox_reclaim", *args, stdout=out)
    return out.getvalue(), counts(out.getvalue())


def counts(out: str) -> tuple[int, int, int, int]:
    match = RECLAIMED.search(out)
    assert match, out
    return tuple(int(n) for n in match.groups())  # type: ignore[return-value]


def lease_expired(row: InboxMessage) -> None:
    """Wait until the lease of ``row`` (as stored now) has passed."""
    row.refresh_from_db()
    assert row.locked_until is not None
    left = (row.locked_until - timezone.now()).total_seconds()
    time.sleep(max(0.0, left) + 0.2)
    assert timezone.now() > row.locked_until


def wait_in_handler(proc: subprocess.Popen[str], row: InboxMessage) -> None:
    """Poll the database until a worker has written its effect and sleeps in the handler.

    The handler's insert is uncommitted, so it shows as a backend ``idle in transaction``
    whose last statement inserted into the effects table (on MariaDB, as a row of the effects
    table that a locking read cannot take at once).
    """
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":  # the effect's row, written and not committed
                try:
                    cursor.execute(
                        "SELECT 1 FROM effects_effect WHERE message_id = %s FOR UPDATE NOWAIT",
                        [row.message_id],
                    )
                    cursor.fetchall()
                    cursor.execute("SELECT 0")
                except OperationalError:  # locked: its transaction is open
                    cursor.execute("SELECT 1")
            else:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND state = 'idle in transaction' "
                    "AND query LIKE %s",
                    ['INSERT INTO "effects_effect"%'],
                )
            (inside,) = cursor.fetchone()
        row.refresh_from_db()
        if inside and row.status == Status.IN_PROGRESS:
            return
        assert time.monotonic() < deadline, "the worker never reached its handler"
        time.sleep(0.05)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


# --- (a) a worker SIGKILLed in its handler ---------------------------------------------------


# --- (b) a worker SIGSTOPped in its handler: a zombie --------------------------------------


# --- (c) live leases are never touched -------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_reclaim_never_touches_a_live_lease() -> None:
    live = stuck("live", expires_in=300, claimed_ago=3600)
    batch_lease = uuid.uuid4().hex
    live_mates = [stuck(f"live-mate-{n}", lease_id=batch_lease, expires_in=300) for n in range(3)]
    expired = stuck("expired")
    watched = [live, *live_mates]
    before = [snapshot(row) for row in watched]

    out, result = reclaim("-v", "2")

    assert result == (1, 1, 0, 0), out
    assert [snapshot(row) for row in watched] == before
    assert InboxMessage.objects.get(pk=expired.pk).status == Status.FAILED
    # Nor when run again, for this consumer only.
    assert reclaim("--consumer", "effects")[1] == (0, 0, 0, 0)
    assert [snapshot(row) for row in watched] == before


# --- (d) --older-than, --dry-run, dead, blame ------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_older_than_leaves_recent_claims() -> None:
    old = stuck("old", claimed_ago=600)
    recent = stuck("recent", claimed_ago=30)
    recent_before = snapshot(recent)

    out, result = reclaim("--older-than", "5m", "-v", "2")

    assert result == (1, 1, 0, 0), out
    assert "effects old -> failed" in out
    assert snapshot(recent) == recent_before
    old.refresh_from_db()
    assert (old.status, [e["type"] for e in old.errors]) == (Status.FAILED, ["LeaseExpired"])

    assert reclaim("--older-than", "10s")[1] == (1, 1, 0, 0)
    recent.refresh_from_db()
    assert recent.status == Status.FAILED


@pytest.mark.django_db(transaction=True)
def test_dry_run_changes_nothing_and_prints_what_it_would_do() -> None:
    rows = [
        stuck("would-fail", attempts=1),
        stuck("would-die", attempts=3),
        *[stuck(f"batch-{n}", lease_id="l" * 32, attempts=2) for n in range(3)],
    ]
    before = [snapshot(row) for row in rows]

    out, result = reclaim("--dry-run", "-v", "2")

    assert result == (5, 2, 1, 2), out
    assert "inbox_reclaim: would reclaim 5 row(s)" in out
    for line in (
        "effects would-fail -> failed",
        "effects would-die -> dead",
        "effects batch-0 -> failed",
        "effects batch-1 -> failed",
        "effects batch-2 -> failed",
    ):
        assert line in out, out
    assert [snapshot(row) for row in rows] == before

    # The real run does what the dry run said.
    real, result = reclaim("-v", "2")
    assert result == (5, 2, 1, 2), real
    assert sorted(real.splitlines()[:-1]) == sorted(out.splitlines()[:-1])


@pytest.mark.django_db(transaction=True)
def test_reclaimed_row_past_max_attempts_goes_dead() -> None:
    row = stuck("last-chance", attempts=3)  # INBOX_CONSUMERS["effects"]["max_attempts"]

    out, result = reclaim()

    assert result == (1, 0, 1, 0), out
    row.refresh_from_db()
    assert (row.status, row.attempts, row.next_attempt_at) == (Status.DEAD, 3, None)
    assert (row.lease_id, row.locked_until) == ("", None)
    (entry,) = row.errors
    assert (entry["type"], entry["attempt"], entry["outcome"]) == ("LeaseExpired", 3, "dead")
    assert entry["retry_at"] is None
    assert "giving up after 3 attempts" in row.last_error
    assert not InboxMessage.objects.due().exists()


@pytest.mark.django_db(transaction=True)
def test_a_row_dead_after_its_only_attempt_says_one_attempt() -> None:
    from django.conf import settings
    from django.test import override_settings

    consumers = {**settings.INBOX_CONSUMERS}
    consumers["effects"] = {**consumers.get("effects", {}), "max_attempts": 1}
    with override_settings(INBOX_CONSUMERS=consumers):
        row = stuck("only-chance", attempts=1)
        out, result = reclaim()

    assert result == (1, 0, 1, 0), out
    row.refresh_from_db()
    assert row.status == Status.DEAD
    assert row.last_error.endswith("; giving up after 1 attempt"), row.last_error


@pytest.mark.django_db(transaction=True)
def test_only_the_running_row_of_a_dead_workers_batch_is_blamed() -> None:
    lease = uuid.uuid4().hex
    first = stuck("batch-first", lease_id=lease, attempts=2)
    fresh = stuck("batch-fresh", lease_id=lease, attempts=1)
    retried = stuck("batch-retried", lease_id=lease, attempts=3)

    out, result = reclaim()

    assert result == (3, 1, 0, 2), out
    first.refresh_from_db()
    assert (first.status, first.attempts) == (Status.FAILED, 2)
    assert [(e["type"], e["attempt"]) for e in first.errors] == [("LeaseExpired", 2)]
    fresh.refresh_from_db()
    assert (fresh.status, fresh.attempts, fresh.history) == (Status.RECEIVED, 0, [])
    retried.refresh_from_db()
    assert (retried.status, retried.attempts, retried.history) == (Status.FAILED, 2, [])
    for row in (fresh, retried):
        assert (row.lease_id, row.locked_until) == ("", None)
        assert row.next_attempt_at is not None and row.next_attempt_at <= timezone.now()
    due = set(InboxMessage.objects.due().values_list("message_id", flat=True))
    assert {"batch-fresh", "batch-retried"} <= due


@pytest.mark.django_db(transaction=True)
def test_blame_holds_when_a_batch_is_split_across_reclaim_transactions() -> None:
    """A dead worker's batch larger than ``--batch-size`` still blames only its lowest row."""
    groups = []
    for g in range(3):
        lease = uuid.uuid4().hex
        groups.append([stuck(f"g{g}-{n}", lease_id=lease) for n in range(4)])

    out, result = reclaim("--batch-size", "3")

    assert result == (12, 3, 0, 9), out
    for group in groups:
        statuses = [InboxMessage.objects.get(pk=row.pk) for row in group]
        assert [(r.status, r.attempts, len(r.errors)) for r in statuses] == [
            (Status.FAILED, 1, 1),
            *[(Status.RECEIVED, 0, 0)] * 3,
        ]


# --- (e) two inbox_reclaim processes at once -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_it_says_what_it_does_with_waiting_rows_past_their_gap_timeout() -> None:
    """It parked them, and said "reclaimed 0 row(s)"; its dry run did not mention them."""
    from django_inbox import Outcome, deliver

    outcome = deliver(
        consumer="ordered", message_id="v5", event_type="ordered.apply", payload={},
        key="K-gap", sequence=5,
    )  # fmt: skip
    assert outcome == Outcome.WAITING
    past = timezone.now() - timedelta(hours=1)
    # waiting for an hour, past its deadline
    InboxMessage.objects.filter(message_id="v5").update(next_attempt_at=past, updated_at=past)

    dry, _ = reclaim("--dry-run")
    assert "would look at 1 waiting row past gap_timeout (parked if its gap is still open)" in dry
    assert InboxMessage.objects.get(message_id="v5").status == Status.WAITING
    done, _ = reclaim()
    assert "parked 1 waiting row whose gap outlived gap_timeout" in done
    assert InboxMessage.objects.get(message_id="v5").status == Status.PARKED
