"""``purge()`` / ``inbox_purge``: only finished rows past their retention are ever deleted.

The parts that run real processes; the rest is in ``tests/unit/test_services_purge.py``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone
from effects.models import Effect

from django_inbox import store
from django_inbox.models import InboxMessage
from tests.conftest import MANAGE, ROOT
from tests.effects import effect_counts, lost_and_doubled
from tests.unit.test_services_purge import (
    BULK,
    BULK_SQL,
    LIVE_MAX,
    LIVE_MIN,
    NEVER_PURGED,
    PENDING_EACH,
    PENDING_SQL,
    SUMMARY,
    Manage,
    Status,
    bulk_counts,
)


@pytest.mark.postgres
@pytest.mark.slow
def test_purge_a_million_rows_while_a_worker_processes_new_messages(manage: Manage) -> None:
    started = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(BULK_SQL, [BULK])
        for status in (*NEVER_PURGED, Status.DEAD):
            cursor.execute(PENDING_SQL, [str(status), str(status), PENDING_EACH])
        cursor.execute("ANALYZE django_inbox_inboxmessage")  # as autovacuum would have
    print(f"\nfilled {BULK:,} completed rows in {time.monotonic() - started:.1f}s")
    assert bulk_counts() == (BULK // 2, BULK // 2)

    live: list[str] = []

    def store_live() -> None:
        message_id = f"live-{len(live)}"
        store(consumer="effects", message_id=message_id, event_type="effect.write", payload={})
        live.append(message_id)

    for _ in range(200):  # the worker finds work the moment it starts
        store_live()
    worker = manage("inbox_process", "--consumer", "effects", "--until-idle", "3")
    purgers: list[subprocess.Popen[str]] = []
    at_purge_end: dict[str, int] = {}
    feed_error: list[BaseException] = []

    def purging() -> bool:
        return not purgers or purgers[0].poll() is None

    def feed() -> None:
        """Keep storing new messages for as long as the purge runs (at least LIVE_MIN)."""
        try:
            while len(live) < LIVE_MIN or (purging() and len(live) < LIVE_MAX):
                store_live()
                if not purging() and not at_purge_end:
                    at_purge_end.update(stored=len(live), processed=Effect.objects.count())
                time.sleep(0.005)
            if not at_purge_end:
                at_purge_end.update(stored=len(live), processed=Effect.objects.count())
        except BaseException as exc:  # pragma: no cover - reported below
            feed_error.append(exc)
        finally:
            connection.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    # The purge starts once the worker is busy, and the feed goes on until the purge is over:
    # the worker claims and completes rows in the same table for the whole purge.
    deadline = time.monotonic() + 120
    while not Effect.objects.exists():
        assert time.monotonic() < deadline, "the worker processed nothing in 120 s"
        time.sleep(0.05)
    purgers.append(manage("inbox_purge", "--batch-size", "10000"))
    purger = purgers[0]

    # Should the worker go idle for 3 s while the feed is still running (a starved machine),
    # start another one: what counts is that every message is processed exactly once.
    pending = InboxMessage.objects.filter(consumer="effects").exclude(status=Status.COMPLETED)
    worker_outputs: list[str] = []
    while True:
        out, err = worker.communicate(timeout=600)
        assert worker.returncode == 0, err[-3000:]
        worker_outputs.append(out.strip())
        if not feeder.is_alive() and not pending.exists():
            break
        assert len(worker_outputs) < 20, worker_outputs
        worker = manage("inbox_process", "--consumer", "effects", "--until-idle", "3")
    feeder.join(timeout=60)
    assert feed_error == [], feed_error

    out, err = purger.communicate(timeout=600)
    assert purger.returncode == 0, err[-3000:]
    lines = out.strip().splitlines()
    for line in lines:
        print(line)
    [summary] = [line for line in lines if SUMMARY.search(line)]
    deleted, batches, seconds, rate = SUMMARY.search(summary).groups()  # type: ignore[union-attr]
    print(
        f"PURGE RATE: {rate} rows/s ({deleted} rows, {batches} batches of 10,000, {seconds}s) "
        f"while {len(live):,} new messages were stored and processed; workers: {worker_outputs}; "
        f"when the purge ended (or the feed, if later): {at_purge_end}"
    )
    assert int(deleted.replace(",", "")) == BULK // 2
    assert int(batches.replace(",", "")) == BULK // 2 // 10_000
    assert any("dead rows kept" in line for line in lines), lines
    assert int(rate.replace(",", "")) > 0

    # Exactly the expired completed rows are gone; no recent one was touched.
    assert bulk_counts() == (0, BULK // 2)
    assert not InboxMessage.objects.filter(
        status=Status.COMPLETED, processed_at__lt=timezone.now() - timedelta(days=30)
    ).exists()
    # Pending and operator rows of every age are all there, unchanged; dead rows are kept
    # because INBOX_DEAD_RETENTION is not set.
    for status in (*NEVER_PURGED, Status.DEAD):
        assert (
            InboxMessage.objects.filter(
                consumer="legacy", status=status, message_id__startswith=f"{status}-"
            ).count()
            == PENDING_EACH
        ), status
    # The worker's messages: each processed exactly once, none purged (they are recent).
    assert len(live) >= LIVE_MIN
    lost, doubled = lost_and_doubled(set(live))
    print(f"worker during purge: {len(live):,} messages, lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)
    assert sum(effect_counts().values()) == len(live)
    live_rows = InboxMessage.objects.filter(consumer="effects", message_id__startswith="live-")
    assert live_rows.count() == len(live)
    assert set(live_rows.values_list("status", flat=True)) == {Status.COMPLETED}
    assert set(live_rows.values_list("attempts", flat=True)) == {1}
    handled = sum(int(re.search(r"handled (\d+)", o).group(1)) for o in worker_outputs)  # type: ignore[union-attr]
    assert handled == len(live), worker_outputs


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "message"),
    [(s, f"{s} rows are never purged") for s in NEVER_PURGED]
    + [("archived", "unknown status 'archived'")],
)
def test_command_refuses_a_status_that_is_never_purged(
    status: str, message: str, tmp_path: Path
) -> None:
    """The real command exits 2 (misconfigured) before it opens the database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'never-opened.sqlite3'}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "testproject"), str(ROOT)])
    result = subprocess.run(
        [sys.executable, str(MANAGE), "inbox_purge", "--status", status],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr, result.stderr
    assert "completed, skipped, dead" in result.stderr  # says what can be purged
    assert not (tmp_path / "never-opened.sqlite3").exists()


@pytest.mark.postgres
def test_ctrl_c_during_a_purge_keeps_what_was_done_without_a_traceback(manage: Manage) -> None:
    """It printed a ``KeyboardInterrupt`` traceback and nothing about the rows deleted."""
    from tests.unit.test_services_purge import make

    for n in range(3):
        make("effects", Status.COMPLETED, age=90 * 86400, message_id=f"old-{n}")
    proc = manage(
        "inbox_purge", "--older-than", "30d", "--batch-size", "1", "--pause", "10m"
    )  # a batch, then a long pause: Ctrl-C comes during it
    while InboxMessage.objects.count() == 3:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 130, err
    assert err.strip().splitlines() == [
        "CommandError: interrupted: the batches done so far are committed, the rest is "
        "untouched; run the command again to go on"
    ], err
    assert InboxMessage.objects.count() == 2
