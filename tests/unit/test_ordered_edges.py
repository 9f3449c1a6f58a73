"""Ordered consumers' edge cases found by a red-team pass over the operator-action fixes: a
re-run ending on a hole, purges of dead versions (of a re-run, and racing a decision), the
migration's skips, ``stalled`` false positives and its plan, ``--wait`` on a hole, consumers
that stop being ordered, a replay past a gap during a re-run, stale rows at a hole. Each test
failed before its fix."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from effects import inbox_handlers

from django_inbox import Outcome
from django_inbox.models import InboxKey, InboxMessage
from django_inbox.ordered import waits
from django_inbox.services import collect, operator, purge, select, skipping
from django_inbox.services.rerun import rerun_blocked, rerun_left
from tests.ordered import sent_cleared  # noqa: F401  (autouse)
from tests.plans import explain, rows_read, take_statistics
from tests.unit.test_ordered_operator_actions import (
    ACTOR,
    CONSUMER,
    drain,
    park_gaps,
    policy,
    row,
    send,
    status,
)

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


def key_state(key: str) -> tuple[int, int | None]:
    k = InboxKey.objects.get(consumer=CONSUMER, key=key)
    return k.applied_sequence, k.rerun_through


def rerun(key: str) -> Any:
    return operator.replay(
        select(consumer=CONSUMER, keys=[key], statuses=["completed"]), force=True, **ACTOR
    )


def fix_payload(message_id: str, sequence: int) -> None:
    found = row(message_id)
    found.payload = {"n": sequence}
    found.save(update_fields=["payload"])


# --- R1: a re-run whose range ends on a hole never ends --------------------------------------


def test_r1_a_rerun_ending_on_a_hole_ends() -> None:
    """K: 1 applied; 2 never arrives; 3 parked for the gap, replayed past it (key at 2), and
    dead. A re-run of K (rows: 1; hole: 2; through = 2), then the fixed 3 replayed: the re-run
    passes 2 as its first run did, and ends. (The key stayed at 1 < through for ever.)"""
    with policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 3, reject="bad") == Outcome.WAITING
        assert park_gaps() == 1
        operator.replay(select(consumer=CONSUMER, message_ids=["K-3"]), **ACTOR)
        drain()
        assert status("K-3") == "dead"
        assert key_state("K")[0] == 2  # jump_gap passed 2

        rerun("K")
        assert key_state("K") == (0, 2)
        drain(idle=1.5)  # re-run of 1, sweeps
        fix_payload("K-3", 3)
        operator.replay(select(consumer=CONSUMER, message_ids=["K-3"]), **ACTOR)
        assert send("K", 4) in (Outcome.WAITING, Outcome.PROCESSED)
        drain(idle=1.5)
        park_gaps()
        drain(idle=0.2)

    assert key_state("K")[0] == 4, (key_state("K"), status("K-3"), row("K-3").last_error)
    assert (status("K-3"), status("K-4")) == ("completed", "completed")


# --- R2: a dead version of a re-run is kept by a purge --------------------------------------


def test_r2_a_dead_version_of_a_rerun_is_kept_by_a_purge() -> None:
    """A re-run's dead version holds its key's rebuild until an operator replays or skips it.
    Purged, the re-run passed it as if its first run had: a version the first run applied was
    dropped from the rebuild, and nobody decided it. The purge keeps it, and says so."""
    with policy(gap_timeout=0.05):
        for n in (1, 2, 3):
            send("K", n)
        inbox_handlers.SENT.clear()
        bad = row("K-2")
        bad.payload = {"n": 2, "reject": "the fixed handler rejects it"}
        bad.save(update_fields=["payload"])
        rerun("K")
        drain()
        assert (status("K-2"), status("K-3")) == ("dead", "waiting")
        result = purge(statuses=("dead",), older_than=0)
        assert (result.deleted["dead"], result.held) == (0, 1)
        drain(idle=1.5)
        park_gaps()
        drain(idle=0.2)
        assert (status("K-2"), status("K-3")) == ("dead", "waiting")
        assert {p.kind for p in collect(consumer=CONSUMER).problems} == {"dead", "stalled"}

        skipping.skip(select(consumer=CONSUMER, message_ids=["K-2"]), **ACTOR)
        drain()
    assert (status("K-2"), status("K-3")) == ("skipped", "completed")
    assert key_state("K")[0] == 3


# --- R3: purge of a dead predecessor racing a version going waiting --------------------------


@pytest.mark.server_db  # two connections at once (SQLite's test database is one, in memory)
def test_r3_purge_racing_a_new_waiting_version_leaves_no_orphan() -> None:
    """deliver() of K-3 decides 'waiting, no deadline' under the key's lock because K-2 (dead)
    exists, while inbox_purge deletes K-2. The purge took no key lock: K-3 was left waiting
    behind nothing, never swept, no problem reported. It now deletes a dead version under its
    key's lock and gives the version behind it a deadline: K-3 is parked for the gap."""
    with policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 2, reject="dead") == Outcome.DEAD
        decided, purged = threading.Event(), threading.Event()
        real = waits.predecessor_exists

        def slow(*args: Any, **kwargs: Any) -> bool:
            found = real(*args, **kwargs)
            if threading.current_thread().name == "deliverer":
                decided.set()
                purged.wait(10)
            return found

        outcome: list[Any] = []

        def deliverer() -> None:
            try:
                outcome.append(send("K", 3))
            finally:
                connections.close_all()

        waits.predecessor_exists = slow  # type: ignore[assignment]
        try:
            thread = threading.Thread(target=deliverer, name="deliverer")
            thread.start()
            assert decided.wait(10)
            result = purge(statuses=("dead",), older_than=0)
            purged.set()
            thread.join(10)
        finally:
            waits.predecessor_exists = real  # type: ignore[assignment]
        assert result.deleted["dead"] == 1
        assert outcome == [Outcome.WAITING]
        time.sleep(0.1)
        for _ in range(3):
            park_gaps()
        problems = collect(consumer=CONSUMER, max_pending_age=0.01).problems
    assert status("K-3") == "parked"
    assert [p.kind for p in problems] == ["stalled"]


# --- R4: inbox_replay --wait stops on a re-run passing a hole, behind a stale dead row -------


def test_r4_wait_does_not_report_blocked_while_a_rerun_passes_a_hole() -> None:
    """K: 1; 2 dead, then a fixed copy of 2 (new id) runs; 3 never arrives, 4 replayed past the
    gap. In a re-run of K, 4 waits a second for the sweep to pass the hole at 3: it was
    counted as 'behind a dead version' (the stale dead K-2, which holds nothing up), so --wait
    stopped and exited 1 although the re-run was about to finish on its own."""
    with policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 2, reject="dead") == Outcome.DEAD
        assert send("K", 2, message_id="K-2-fixed") == Outcome.PROCESSED
        assert send("K", 4) == Outcome.WAITING
        assert park_gaps() == 1
        operator.replay(select(consumer=CONSUMER, message_ids=["K-4"]), **ACTOR)
        drain()
        assert status("K-4") == "completed"
        result = operator.replay(
            select(consumer=CONSUMER, keys=["K"], statuses=["completed"]),
            force=True,
            keep=None,
            **ACTOR,
        )
        pks = [pk for pk, _, _, was in result.rows if was in ("completed", "skipped")]
        drain()  # runs 1 and 2 again; 4 waits for the hole look
        left, blocked = rerun_left([CONSUMER], pks=pks), rerun_blocked([CONSUMER], pks=pks)
        assert (left, blocked) == (1, 0), "--wait would stop here and exit 1"
        drain(idle=1.5)
        assert rerun_left([CONSUMER], pks=pks) == 0
    assert status("K-4") == "completed"


# --- R5: the migration's data step keeps every pending skip ----------------------------------


@pytest.mark.postgres
def test_r5_migration_keeps_skips_of_released_and_parked_versions() -> None:
    """Before 0012 a skip was the last history entry. A skipped-ahead version that its key had
    already released ('received', workers stopped for the upgrade), that the sweep parked for
    a gap, or whose skip failed to be recorded keeps its skip: 0012 marked waiting and skipped
    rows only, and the worker then ran a version the operator skipped."""
    from django.db.migrations.executor import MigrationExecutor

    table = InboxMessage._meta.db_table
    skip = '[{"kind": "skip", "by": "alice", "reason": "", "at": "2026-01-01T00:00:00+00:00"}]'
    gap = (
        '[{"kind": "skip", "by": "alice", "reason": "", "at": "2026-01-01T00:00:00+00:00"},'
        ' {"kind": "gap", "at": "2026-01-01T00:01:00+00:00", "message": "gap: ..."}]'
    )
    executor = MigrationExecutor(connection)
    executor.migrate([("django_inbox", "0011_drop_pair_constraint")])
    try:
        with connection.cursor() as cursor:
            for message_id, st, history in (
                ("w", "waiting", skip),
                ("r", "received", skip),
                ("p", "parked", gap),
                ("f", "failed", skip[:-1] + ', {"kind": "error", "at": "x"}]'),
            ):
                cursor.execute(
                    f'INSERT INTO "{table}" (consumer, message_id, source, event_type, key, '
                    "sequence, payload, headers, status, attempts, last_error, history, "
                    "received_at, updated_at, lease_id, rerun) VALUES (%s, %s, '', 't', 'K', "
                    "5, '{}', '{}', %s, 0, '', %s::jsonb, now(), now(), '', false)",
                    [CONSUMER, message_id, st, history],
                )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    marked = dict(
        InboxMessage.objects.filter(consumer=CONSUMER).values_list("message_id", "skip_requested")
    )
    assert marked == {"w": True, "r": True, "p": True, "f": True}


# --- R6: stalled: a stale parked gap row is reported as holding its key up for ever ----------


def test_r6_stalled_is_not_reported_for_a_key_that_moved_on() -> None:
    """K-3 parked for the gap at 2; its copy (new id) is replayed past the gap and runs, and the
    key goes on to 4. K-3 is now stale: it holds nothing up (it was reported as 'stalled', and
    inbox_stats exited 1, until someone replayed or purged it)."""
    with policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 3) == Outcome.WAITING
        assert send("K", 3, message_id="K-3-copy") == Outcome.WAITING
        assert park_gaps() == 2
        operator.replay(select(consumer=CONSUMER, message_ids=["K-3-copy"]), **ACTOR)
        drain()
        assert send("K", 4) == Outcome.PROCESSED
        assert key_state("K")[0] == 4
        problems = collect(consumer=CONSUMER).problems
    assert not [p for p in problems if p.kind == "stalled"]


# --- R7: a skip of a re-run's version during the re-run -----------------------------------


def test_r7_a_reruns_version_skipped_during_the_rerun_is_skipped_and_the_rebuild_ends() -> None:
    """An operator skips the re-run's version 2 while it waits: it is skipped when the key
    reaches it (counting as applied), and the rebuild goes on to 3. (Held before the fixes.)"""
    for n in (1, 2, 3):
        send("K", n)
    rerun("K")
    skipping.skip(select(consumer=CONSUMER, message_ids=["K-2"]), **ACTOR)  # rerun row, waits
    drain()
    assert status("K-2") == "skipped"
    assert row("K-2").skip_requested
    assert key_state("K")[0] == 3


# --- R8: the 'stalled' count reads indexes, not the table ------------------------------------


def _bulk(consumer: str, key: str, start: int, stop: int, st: str) -> None:
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" (consumer, message_id, source, event_type, key, sequence, '
            "payload, headers, status, attempts, last_error, history, received_at, updated_at, "
            "lease_id, rerun, skip_requested, processed_at) "
            "SELECT %s, %s || '-' || g, '', 'projection.apply', %s, g, '{}', '{}', %s, 1, '', "
            "'[]', now(), now(), '', false, false, now() FROM generate_series(%s, %s) g",
            [consumer, f"{consumer}-{key}-{st}", key, st, start, stop],
        )


@pytest.mark.postgres
def test_r8_the_stalled_count_probes_indexes_whatever_the_table_holds() -> None:
    """300 keyed dead rows of an unordered consumer beside 40,000 of its completed rows: the
    count of held-up keys read the table once per dead row (4.5 s against 43 ms without it,
    under every health check). It now looks at ordered consumers' rows only, and probes the
    key's row and the next version by index."""
    _bulk("stream", "T", 1, 40_000, "completed")
    take_statistics(InboxMessage._meta.db_table)
    _bulk("stream", "T", 1, 300, "dead")
    _bulk(CONSUMER, "D", 1, 300, "dead")  # an ordered key's old dead versions: none held up
    with CaptureQueriesContext(connection) as queries:
        assert not [p for p in collect().problems if p.kind == "stalled"]
    [held] = [q["sql"] for q in queries if "applied_sequence" in q["sql"]]
    assert rows_read(explain(held, analyze=True)) < 2_000


# --- R9: a consumer switched from ordered to unordered ---------------------------------------


def test_r9_versions_waiting_when_a_consumer_stops_being_ordered_are_not_lost() -> None:
    """K-1 fails (retrying), K-2 waits behind it with no deadline; then the consumer is made
    unordered. K-1 runs on the unordered path (no release): K-2 waited for ever, silently. A
    worker now makes an unordered consumer's waiting rows due."""
    with policy(gap_timeout=0.05):
        assert send("K", 1, fail_times=1) == Outcome.FAILED
        assert send("K", 2) == Outcome.WAITING
        assert row("K-2").next_attempt_at is None
    with policy(ordered=False, gap_timeout=0.05):
        time.sleep(0.1)
        drain(idle=1.5)
        problems = collect(consumer=CONSUMER, max_pending_age=0.5).problems
    assert (status("K-1"), status("K-2")) == ("completed", "completed")
    assert not problems


# --- R10: a replay past a gap during a rebuild is lost ---------------------------------------


def test_r10_a_replay_past_a_gap_during_a_rebuild_is_not_lost() -> None:
    """K-1..3 applied; K-5 parked for the gap at 4. The operator re-runs K, then replays K-5 to
    run it past the gap: the key goes past 4 once the re-run ends, and K-5 runs right after
    it. (The replay passed nothing, and K-5 was parked again a gap_timeout later.)"""
    with policy(gap_timeout=0.05):
        for n in (1, 2, 3):
            send("K", n)
        assert send("K", 5) == Outcome.WAITING
        assert park_gaps() == 1
        rerun("K")
        operator.replay(select(consumer=CONSUMER, message_ids=["K-5"]), **ACTOR)
        drain(idle=1.5)
        park_gaps()
        drain(idle=0.2)
    assert status("K-5") == "completed"


# --- R11: a stale dead row at a hole holds a rebuild for ever --------------------------------


def test_r11_a_stale_dead_row_at_a_hole_does_not_hold_a_rebuild() -> None:
    """K: 1; 3 replayed past the gap at 2 and applied. A message for sequence 2 then arrives
    that the consumer cannot handle (no handler: kept dead, no ordering decision). It held
    nothing up on the first run, and the re-run passes it too (it looked at it every second
    and never passed the hole)."""
    from django_inbox import deliver

    with policy(gap_timeout=0.05):
        send("K", 1)
        assert send("K", 3) == Outcome.WAITING
        assert park_gaps() == 1
        operator.replay(select(consumer=CONSUMER, message_ids=["K-3"]), **ACTOR)
        drain()
        assert key_state("K")[0] == 3
        assert deliver(
            consumer=CONSUMER, message_id="K-2-late", event_type="no.such.type",
            payload={}, key="K", sequence=2,
        ) == Outcome.DEAD  # fmt: skip
        rerun("K")
        drain(idle=2.5)
    assert key_state("K")[0] == 3 and status("K-3") == "completed"
