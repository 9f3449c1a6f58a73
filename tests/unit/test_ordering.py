"""Ordered consumers (any database): per key, by sequence; stale versions skipped, gaps
waited for and parked, a failing version holding back only its own key."""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from effects.models import OrderedRun

from django_inbox import InvalidField, Outcome, deliver
from django_inbox.models import InboxKey, InboxMessage
from django_inbox.ordered.gaps import park_expired_gaps
from django_inbox.processing.worker import Worker
from django_inbox.services import collect, operator, skipping
from tests import ordered
from tests.ordered import Versions

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
CONSUMER = "ordered"


VERSIONS = Versions(CONSUMER, "ordered.apply")
send, put, row = VERSIONS.send, VERSIONS.put, VERSIONS.row


def applied(key: str) -> int | None:
    found = InboxKey.objects.filter(consumer=CONSUMER, key=key).first()
    return None if found is None else found.applied_sequence


def runs(key: str) -> list[int | None]:
    return list(
        OrderedRun.objects.filter(key=key).order_by("id").values_list("sequence", flat=True)
    )


def drain(**options: Any) -> None:
    ordered.drain(CONSUMER, **options)


def ordered_policy(**changes: Any) -> Any:
    return ordered.policy(CONSUMER, **changes)


def test_versions_in_order_run_and_the_key_remembers_the_last() -> None:
    assert [send("K", n) for n in (1, 2, 3)] == [Outcome.PROCESSED] * 3
    assert runs("K") == [1, 2, 3]
    assert applied("K") == 3


def test_a_gap_waits_and_the_delivery_that_fills_it_runs_both_in_order() -> None:
    assert send("K", 3) == Outcome.WAITING
    assert send("K", 2) == Outcome.WAITING
    waiting = row("K-3")
    assert waiting.status == Status.WAITING and waiting.attempts == 0
    assert "waits for sequence 1 of key 'K'" in waiting.last_error
    assert runs("K") == []

    assert send("K", 1) == Outcome.PROCESSED

    assert runs("K") == [1, 2, 3]
    assert applied("K") == 3
    assert {r.status for r in InboxMessage.objects.filter(key="K")} == {Status.COMPLETED}
    assert row("K-3").last_error == ""


def test_a_stale_version_with_a_new_message_id_is_skipped_not_run() -> None:
    send("K", 1)
    send("K", 2)

    assert send("K", 1, message_id="K-1-resent") == Outcome.SKIPPED

    skipped = row("K-1-resent")
    assert skipped.status == Status.SKIPPED
    assert "stale: key 'K' has already applied sequence 2; this is 1" in skipped.last_error
    assert runs("K") == [1, 2]
    # Delivered again, it is still skipped; the same id as before is a duplicate.
    assert send("K", 1, message_id="K-1-resent") == Outcome.SKIPPED
    assert send("K", 1) == Outcome.DUPLICATE


def test_a_failing_version_holds_back_its_key_while_another_key_flows() -> None:
    assert send("K", 1, fail_times=1) == Outcome.FAILED
    assert send("K", 2) == Outcome.WAITING
    assert send("L", 1) == Outcome.PROCESSED
    assert send("L", 2) == Outcome.PROCESSED
    assert runs("K") == [] and runs("L") == [1, 2]

    time.sleep(0.1)  # the retry's backoff (at most 0.05 s)
    drain()

    assert runs("K") == [1, 2]
    assert row("K-1").attempts == 2 and row("K-2").status == Status.COMPLETED


def test_a_dead_version_keeps_its_successors_waiting_until_an_operator_skips_it() -> None:
    with ordered_policy(gap_timeout=0.05):
        assert send("K", 1, fail_always=True) == Outcome.FAILED
        assert send("K", 2) == Outcome.WAITING
        for _ in range(5):
            time.sleep(0.1)
            drain()
        assert row("K-1").status == Status.DEAD
        # Past the gap timeout, but the missing version exists (dead): not a gap, no park.
        assert park_expired_gaps() == 0
        assert row("K-2").status == Status.WAITING

        result = skipping.skip(
            InboxMessage.objects.filter(message_id="K-1"), actor="alice", reason="bad data"
        )

    assert result.total == 1
    skipped = row("K-1")
    assert skipped.status == Status.SKIPPED
    assert skipped.history[-1]["kind"] == "skip" and skipped.history[-1]["by"] == "alice"
    assert applied("K") == 1
    drain()
    assert runs("K") == [2]
    assert applied("K") == 2


def test_stored_versions_in_shuffled_order_are_applied_in_order_by_workers() -> None:
    rng = random.Random(7)
    versions = [(key, n) for key in "ABCD" for n in range(1, 16)]
    rng.shuffle(versions)
    for key, n in versions:
        assert put(key, n)

    drain(batch_size=7)

    for key in "ABCD":
        assert runs(key) == list(range(1, 16)), key
        assert applied(key) == 15
    assert InboxMessage.objects.exclude(status=Status.COMPLETED).count() == 0


def test_commit_every_keeps_each_keys_order() -> None:
    versions = [(key, n) for key in "AB" for n in range(1, 11)]
    random.Random(3).shuffle(versions)
    for key, n in versions:
        put(key, n)

    drain(commit_every=5)

    assert runs("A") == list(range(1, 11)) and runs("B") == list(range(1, 11))


def test_messages_without_a_sequence_run_and_leave_the_key_alone() -> None:
    send("K", 1)
    assert send("K", None, message_id="note") == Outcome.PROCESSED
    assert send("", 7, message_id="no-key") == Outcome.PROCESSED  # no key: not ordered
    assert runs("K") == [1, None]
    assert applied("K") == 1


def test_unordered_consumers_ignore_sequences() -> None:
    outcome = deliver(
        consumer="effects", message_id="x", event_type="effect.write", payload={},
        key="K", sequence=5,
    )  # fmt: skip
    assert outcome == Outcome.PROCESSED
    assert InboxMessage.objects.get(message_id="x").sequence == 5
    assert not InboxKey.objects.exists()


@pytest.mark.parametrize("bad", [-1, 2**63, 1.5, True, "x", "1e3"])
def test_a_bad_sequence_is_refused_and_nothing_is_stored(bad: object) -> None:
    with pytest.raises(InvalidField, match="sequence"):
        send("K", bad, message_id="bad")  # type: ignore[arg-type]
    assert not InboxMessage.objects.exists()


def test_a_sequence_in_text_is_taken() -> None:
    assert send("K", "1", message_id="text") == Outcome.PROCESSED  # type: ignore[arg-type]
    assert row("text").sequence == 1


def test_stats_count_waiting_rows_their_age_and_parked_gaps() -> None:

    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        send("K", 3)  # waits for 2
        send("L", 5)  # waits for 1
        send("K", 1, message_id="stale")
        time.sleep(0.1)
        park_expired_gaps()
        send("M", 2)  # waits, its gap not yet expired

    stats = collect(consumer=CONSUMER).consumers[CONSUMER]
    assert stats.counts["waiting"] == 1
    assert stats.counts["skipped"] == 1
    assert stats.counts["parked"] == 2 and stats.parked_gaps == 2
    assert stats.oldest_waiting_age >= 0
    assert collect(consumer=CONSUMER).as_dict()["consumers"][CONSUMER]["parked_gaps"] == 2


def test_purge_deletes_old_skipped_rows_and_never_waiting_ones() -> None:
    from datetime import timedelta

    from django.utils import timezone

    from django_inbox.services import purge

    send("K", 1)
    send("K", 1, message_id="stale")
    send("K", 5)
    long_ago = timezone.now() - timedelta(days=400)
    InboxMessage.objects.update(processed_at=long_ago, updated_at=long_ago, received_at=long_ago)

    result = purge()

    assert result.deleted == {"completed": 1, "skipped": 1}
    assert list(InboxMessage.objects.values_list("message_id", "status")) == [("K-5", "waiting")]


def test_the_admin_shows_the_keys_applied_sequence_and_its_versions() -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client
    from django.urls import reverse

    send("K", 1)
    send("K", 3)
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "r@example.com", "pw"))

    page = client.get(reverse("admin:django_inbox_inboxmessage_change", args=[row("K-3").pk]))
    text = page.content.decode()
    assert "key applied up to sequence 1; this message waits for sequence 2" in text
    assert 'id="inbox-key-link"' in text

    view = client.get(
        reverse("admin:django_inbox_inboxmessage_key"), {"consumer": CONSUMER, "key": "K"}
    )
    text = view.content.decode()
    assert view.status_code == 200
    assert "sequence <strong>1</strong> applied" in text
    assert text.index(">K-1<") < text.index(">K-3<")
    assert "inbox-status-waiting" in text and "inbox-status-completed" in text
    # The search for the key's messages in this consumer, with or without a sequence.
    assert f"?consumer={CONSUMER}&amp;q=key%3AK" in text
    assert client.get(reverse("admin:django_inbox_inboxmessage_key")).status_code == 400
    listed = client.get(
        reverse("admin:django_inbox_inboxmessage_changelist"), {"status__exact": "waiting"}
    )
    assert "K-3" in listed.content.decode() and "K-1<" not in listed.content.decode()


def test_a_version_skipped_ahead_of_its_key_is_skipped_when_the_key_reaches_it() -> None:
    send("K", 1)
    assert send("K", 3) == Outcome.WAITING
    assert send("K", 4) == Outcome.WAITING
    result = skipping.skip(InboxMessage.objects.filter(message_id="K-3"), actor="a", reason="bad")
    assert result.total == 1
    assert row("K-3").status == Status.WAITING  # not yet: the key has not reached it

    assert send("K", 2) == Outcome.PROCESSED  # runs 2, skips 3, runs 4

    assert runs("K") == [1, 2, 4]
    assert row("K-3").status == Status.SKIPPED
    assert row("K-3").history[-1]["kind"] == "skip"
    assert row("K-3").last_error == "skipped by a: bad"
    assert applied("K") == 4


def test_a_first_sequence_of_zero() -> None:
    with ordered_policy(first_sequence=0):
        assert send("K", 1) == Outcome.WAITING
        assert send("K", 0) == Outcome.PROCESSED
    assert runs("K") == [0, 1]


def test_a_forced_re_run_of_a_completed_version_rewinds_its_key_and_runs_in_order() -> None:
    send("K", 1)
    send("K", 2)
    result = operator.replay(
        InboxMessage.objects.filter(message_id="K-1"), actor="a", reason="r", force=True
    )
    assert result.changed == {"completed": 2}  # version 2 re-runs after it, to keep the order
    assert (row("K-1").status, row("K-2").status) == (Status.RECEIVED, Status.WAITING)
    assert applied("K") == 0
    drain()
    assert runs("K") == [1, 2, 1, 2]
    assert applied("K") == 3 - 1 and row("K-2").is_rerun
    without_force = operator.replay(
        InboxMessage.objects.filter(message_id="K-1"), actor="a", reason="r"
    )
    assert without_force.total == 0 and row("K-1").status == Status.COMPLETED


def test_the_oldest_waiting_age_counts_from_arrival() -> None:

    with ordered_policy(gap_timeout=0.05):
        send("K", 1)
        send("K", 3, fail_always=True)
        send("K", 2, fail_always=True)  # exists: 3 keeps waiting for it
        InboxMessage.objects.filter(message_id="K-3").update(
            received_at=timezone.now() - timedelta(days=3)
        )
        time.sleep(0.1)
        park_expired_gaps()  # gives 3 more time (its predecessor exists)

    stats = collect(consumer=CONSUMER).consumers[CONSUMER]
    assert row("K-3").status == Status.WAITING
    assert stats.oldest_waiting_age > 2 * 86400


def test_deliver_runs_a_bounded_chain_and_leaves_the_rest_due() -> None:
    from django_inbox.intake.delivery import INLINE_RELEASED

    for n in range(2, INLINE_RELEASED + 5):
        assert send("K", n) == Outcome.WAITING
    assert send("K", 1) == Outcome.PROCESSED
    assert runs("K") == list(range(1, INLINE_RELEASED + 2))
    drain()
    assert runs("K") == list(range(1, INLINE_RELEASED + 5))


def test_a_version_failing_in_a_worker_leaves_its_row_its_key_and_its_successor_as_they_were() -> (
    None
):
    put("K", 1)
    put("K", 2, fail_times=1)
    put("K", 3)
    Worker([CONSUMER]).run_once()  # K-2 fails once; K-3 waits for it

    assert runs("K") == [1] and applied("K") == 1
    assert row("K-2").status == Status.FAILED and row("K-2").processed_at is None
    assert row("K-3").status == Status.WAITING

    time.sleep(0.1)  # the retry's backoff (at most 0.05 s)
    drain()

    assert runs("K") == [1, 2, 3] and applied("K") == 3
    assert {row(f"K-{n}").status for n in (1, 2, 3)} == {Status.COMPLETED}


def _claimed(message_id: str) -> InboxMessage:
    from django_inbox.processing.claims import claim_batch

    (claimed,) = claim_batch(CONSUMER, 1, message_id=message_id)
    return claimed


def _runs_table() -> str:
    return OrderedRun._meta.db_table


@pytest.mark.postgres
def test_a_keys_next_version_is_completed_before_its_handler_and_nothing_follows_it() -> None:
    """One statement locks the key, applies the version, completes its row and releases the
    next one; after the handler the inbox sends nothing but the commit."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_inbox.processing.attempts import attempt

    put("K", 1)
    drain()
    put("K", 3)
    drain()  # K-3 waits for K-2
    put("K", 2)
    claimed = _claimed("K-2")

    with CaptureQueriesContext(connection) as queries:
        attempted = attempt(claimed)
        assert attempted.outcome == Outcome.PROCESSED

    sent = [query["sql"] for query in queries.captured_queries]
    handler = [i for i, sql in enumerate(sent) if _runs_table() in sql]
    assert len(handler) == 1, sent
    assert sent[handler[0] + 1 :] == ["COMMIT"], sent
    assert applied("K") == 2 and row("K-2").status == Status.COMPLETED
    assert list(attempted.released) == [row("K-3").message_id]
    assert row("K-3").status == Status.RECEIVED


@pytest.mark.postgres
def test_a_version_whose_lease_was_taken_over_is_not_run() -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from django_inbox.processing.attempts import process_claimed

    put("K", 1)
    drain()
    put("K", 2)
    claimed = _claimed("K-2")
    InboxMessage.objects.filter(pk=claimed.pk).update(lease_id="another-worker")

    with CaptureQueriesContext(connection) as queries:
        assert process_claimed(claimed) == Outcome.IN_PROGRESS

    assert not any(_runs_table() in query["sql"] for query in queries.captured_queries)
    assert runs("K") == [1] and applied("K") == 1
    taken = row("K-2")
    assert taken.status == Status.IN_PROGRESS and taken.lease_id == "another-worker"


@pytest.mark.server_db
def test_a_worker_moves_on_from_a_key_another_transaction_is_running() -> None:
    """Another worker runs K-2 (its transaction has updated K's row): a worker that claimed
    K-3 gives it back at once instead of waiting for that transaction to end."""
    from django.db import connection, connections

    from django_inbox.processing.attempts import process_claimed

    put("K", 1)
    drain()
    put("K", 3)
    claimed = _claimed("K-3")
    running = connections.create_connection("default")
    try:
        with running.cursor() as other, connection.cursor() as mine:
            other.execute("BEGIN")
            quote = connection.ops.quote_name
            other.execute(
                f"UPDATE {quote(InboxKey._meta.db_table)} SET applied_sequence = 2 "
                f"WHERE consumer = %s AND {quote('key')} = %s",
                [CONSUMER, "K"],
            )
            # A wait for the key fails, not hangs.
            mysql = connection.vendor == "mysql"
            timeout = "innodb_lock_wait_timeout = 5" if mysql else "lock_timeout = '5s'"
            mine.execute(f"SET {timeout}")
            try:
                assert process_claimed(claimed) == Outcome.IN_PROGRESS
            finally:
                mine.execute(
                    "SET innodb_lock_wait_timeout = DEFAULT" if mysql else "RESET lock_timeout"
                )
            other.execute("ROLLBACK")
    finally:
        running.close()
    given_back = row("K-3")
    assert given_back.status == Status.RECEIVED and given_back.attempts == 0
    assert runs("K") == [1]


@pytest.mark.server_db
def test_a_running_versions_batch_mates_are_taken_over_when_their_lease_runs_out() -> None:
    """A worker runs A-2, the first of its batch, past the lease: its row stays locked until
    it commits. The batch-mate B-2, which never started, is taken over by the next claim,
    without an attempt counted, while A-2 is left to the worker running it."""
    from django.db import connections

    from django_inbox.processing.claims import claim_batch

    put("A", 1)
    put("B", 1)
    drain()
    put("A", 2)
    put("B", 2)
    batch = claim_batch(CONSUMER, 2)
    assert [claimed.message_id for claimed in batch] == ["A-2", "B-2"]
    past = timezone.now() - timedelta(minutes=1)
    InboxMessage.objects.filter(pk__in=[claimed.pk for claimed in batch]).update(
        locked_until=past, next_attempt_at=past
    )
    running = connections.create_connection("default")
    try:
        with running.cursor() as cursor:
            cursor.execute("BEGIN")
            cursor.execute(
                f"SELECT 1 FROM {InboxMessage._meta.db_table} WHERE id = %s FOR UPDATE",
                [batch[0].pk],
            )
            taken = claim_batch(CONSUMER, 10)
            cursor.execute("ROLLBACK")
    finally:
        running.close()
    assert [claimed.message_id for claimed in taken] == ["B-2"]
    assert taken[0].attempts == 1  # the dead claim's attempt was not counted against it
    left = row("A-2")
    assert left.status == Status.IN_PROGRESS and left.lease_id == batch[0].lease_id
