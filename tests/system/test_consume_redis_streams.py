"""inbox_consume on Redis Streams: the machine's Redis (and one of the test's own, with
persistence, for a restart), real inbox_consume processes.

Where kombu's Redis lists can lose the message a killed consumer had popped, a stream entry
stays in the group's pending list until acknowledged: every test ends with lost 0, doubled 0
and nothing left pending.
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_inbox.models import InboxMessage
from tests import brokers
from tests import redis_streams_support as streams
from tests.conftest import kill_at_random, restart_until_it_survives
from tests.effects import effect_counts, lost_and_doubled

pytestmark = [pytest.mark.server_db, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
Status = InboxMessage.Status
finish = brokers.finish
NOTHING_OWED = {"lag": 0, "pending": 0}


@pytest.fixture
def stream() -> Iterator[streams.Stream]:
    found = streams.new_stream()
    yield found
    streams.delete_stream(found)


def consume(
    manage: Manage, stream: streams.Stream, *args: str, consumer: str = "stream", **env: str
) -> subprocess.Popen[str]:
    return manage(
        "inbox_consume", "--consumer", consumer, "--queue", stream.name,
        "--broker", stream.broker, *args, env=env,
    )  # fmt: skip


def test_duplicates_and_sigkilled_consumers_apply_each_effect_once(
    manage: Manage, stream: streams.Stream
) -> None:
    """Two consumers in the group while one is SIGKILLed every 1-3 s (10 times): what a killed
    one had read stays pending and is claimed after the lease (2 s for "stream")."""
    messages, expected = brokers.stream(1000, seed=31, sleep=0.02)
    streams.publish(stream, messages)

    kills = kill_at_random(lambda: consume(manage, stream, "--until-idle", "8"), random.Random(31))
    finish(consume(manage, stream, "--until-idle", "4"))  # claims what the last kills left
    finish(manage("inbox_process", "--consumer", "stream", "--until-idle", "3"))

    lost, doubled = lost_and_doubled(expected, "stream")
    left = streams.owed(stream, "stream")
    in_progress = InboxMessage.objects.filter(status=Status.IN_PROGRESS).count()
    print(f"redis streams chaos: {len(messages)} published, kills={kills} lost={lost} "
          f"doubled={doubled} in_progress={in_progress} owed={left}")  # fmt: skip
    assert kills >= 10
    assert (lost, doubled, in_progress) == (0, 0, 0)
    assert left == NOTHING_OWED
    assert InboxMessage.objects.filter(consumer="stream", status=Status.COMPLETED).count() == len(
        expected
    )


def test_a_redis_killed_and_restarted_mid_run_loses_and_doubles_nothing(manage: Manage) -> None:
    with streams.private_redis() as server:
        stream = streams.new_stream(server.url)
        messages, expected = brokers.stream(800, seed=32, sleep=0.005)
        streams.publish(stream, messages)
        proc = consume(manage, stream, "--until-idle", "10")
        deadline = time.monotonic() + 60
        while InboxMessage.objects.filter(consumer="stream").count() < 100:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)

        server.kill()  # SIGKILL: every write was in the append-only file
        time.sleep(2)
        server.start()
        out = finish(proc)
        left = streams.owed(stream, "stream")

    lost, doubled = lost_and_doubled(expected, "stream")
    print(f"redis restarted: {out} lost={lost} doubled={doubled} owed={left}")
    assert "reconnects 0" not in out, out
    assert (lost, doubled) == (0, 0)
    assert left == NOTHING_OWED


def test_acknowledgements_go_in_batches_of_committed_entries(manage: Manage) -> None:
    """Entries are acknowledged with one XACK per batch, not one per entry (an ack held and
    lost only brings a committed entry back, answered as a duplicate): 525 entries (300 ids,
    30% sent again), read 100 at a time, the last batch partial."""
    with streams.private_redis() as server:
        stream = streams.new_stream(server.url)
        messages, expected = brokers.stream(300, seed=35)
        streams.publish(stream, messages)
        out = finish(consume(manage, stream, "--prefetch", "100", "--until-idle", "2"))
        stats = stream.client().info("commandstats")
        xacks = int(stats.get("cmdstat_xack", {}).get("calls", 0))
        left = streams.owed(stream, "stream")

    print(f"{len(messages)} entries acknowledged in {xacks} XACK calls: {out}")
    assert len(messages) % 100 != 0
    assert brokers.summary_counts(out)["acked"] == len(messages), out
    assert lost_and_doubled(expected, "stream") == (0, 0)
    assert left == NOTHING_OWED
    # One per batch of 100, plus one for each second a batch took (ACK_DELAY): never one each.
    assert 0 < xacks <= len(messages) // 10


def test_a_stop_in_the_middle_of_a_batch_sends_the_acknowledgements_it_holds(
    manage: Manage, stream: streams.Stream
) -> None:
    """--max-messages 150 with prefetch 100: the acks of entries 101-150 are held when the
    loop stops (the rest of the batch is given back); they go before the command exits, so no
    committed entry is left pending. Checked before any other consumer claims anything."""
    messages = [{"id": f"m-{k:04d}", "type": "effect.write", "body": {}} for k in range(300)]
    streams.publish(stream, messages)

    out = finish(consume(manage, stream, "--prefetch", "100", "--max-messages", "150"))

    client = stream.client()
    pending = client.xpending_range(stream.name, "stream", min="-", max="+", count=1000)
    entries = dict(client.xrange(stream.name))
    pending_ids = {entries[p["message_id"]][b"message_id"].decode() for p in pending}
    committed = set(
        InboxMessage.objects.filter(consumer="stream", status=Status.COMPLETED).values_list(
            "message_id", flat=True
        )
    )
    print(f"stopped: {out}; {len(pending_ids)} pending, {len(committed)} committed")
    assert len(committed) == 150, out
    assert brokers.summary_counts(out)["requeued"] == 50, out
    assert pending_ids, "the entries given back stay pending, for the next consumer to claim"
    assert not pending_ids & committed, "every committed entry was acknowledged at the stop"


def test_kill_after_commit_before_ack_is_answered_as_a_duplicate(
    manage: Manage, stream: streams.Stream, tmp_path: Path
) -> None:
    kill_file = tmp_path / "kill-after-commit"
    kill_file.touch()
    body = {"kill_after_commit_file": str(kill_file)}
    streams.publish(stream, [{"id": "m-1", "type": "effect.write", "body": body}])

    first = consume(manage, stream, "--until-idle", "3")
    first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    assert InboxMessage.objects.get().status == Status.COMPLETED  # committed, never acked
    time.sleep(2)  # the lease of "stream": then any consumer claims it

    second = finish(consume(manage, stream, "--until-idle", "3"))

    assert brokers.summary_counts(second)["duplicate"] == 1, second
    assert effect_counts("stream") == {"m-1": 1}
    assert streams.owed(stream, "stream") == NOTHING_OWED


def test_hostile_and_malformed_entries_end_in_their_documented_states(
    manage: Manage, stream: streams.Stream
) -> None:
    bad = [
        {"id": "bad-bytes", "type": "effect.write", "body": b"\xff\xfe\x00 not text"},
        {"id": "bad-json", "type": "effect.write", "body": b'{"sku": '},
        {"id": "deep", "type": "effect.write", "body": b"[" * 100_000 + b"]" * 100_000},
        {"id": "too-big", "type": "effect.write", "body": {"blob": "x" * 5000}},
        {"id": "no-type", "body": {"n": 1}},
        {"id": "poison", "type": "effect.write", "body": {"fail_always": True}},
        {"fields": {"message_id": "bad-headers", "event_type": "effect.write",
                    "payload": "{}", "headers": "[1, 2"}},
        {"fields": {"message_id": "list-headers", "event_type": "effect.write",
                    "payload": "{}", "headers": "[1, 2]"}},
        {"fields": {"message_id": "no-payload", "event_type": "effect.write"}},
        {"fields": {"message_id": b"\xff\xfe", "event_type": "effect.write", "payload": "{}"}},
        {"id": None, "type": "effect.write", "body": {"no": "id"}},
    ]  # fmt: skip
    healthy, expected = brokers.stream(100, seed=33)
    streams.publish(stream, bad + healthy)

    out = finish(consume(manage, stream, "--until-idle", "6", INBOX_MAX_PAYLOAD_BYTES="4096"))
    print(out)

    rows = {m.message_id: m for m in InboxMessage.objects.filter(consumer="stream")}
    assert "not valid utf-8" in rows["bad-bytes"].last_error
    assert "not valid JSON" in rows["bad-json"].last_error
    assert "nested too deeply" in rows["deep"].last_error
    assert rows["too-big"].last_error.startswith("PayloadTooLarge")
    assert "no event type" in rows["no-type"].last_error
    assert "headers field is not JSON" in rows["bad-headers"].last_error
    assert "headers field is not a JSON object" in rows["list-headers"].last_error
    assert "not valid JSON" in rows["no-payload"].last_error
    dead = ("bad-bytes", "bad-json", "deep", "too-big", "no-type", "poison", "bad-headers",
            "list-headers", "no-payload")  # fmt: skip
    for message_id in dead:
        assert rows[message_id].status == Status.DEAD, message_id
    assert rows["poison"].attempts == 8
    # The entry without an id and the one whose id is no text: refused, kept in <stream>:dead
    # with the reason.
    counts = brokers.summary_counts(out)
    assert (counts["refused"], counts["reconnects"]) == (2, 0), out
    refused = stream.client().xrange(f"{stream.name}:dead")
    assert len(refused) == 2
    reasons = [fields[b"x-inbox-refused"].decode() for _, fields in refused]
    assert all(reason.startswith("refused by inbox_consume: ") for reason in reasons), reasons
    assert lost_and_doubled(expected, "stream") == (0, 0)
    assert streams.owed(stream, "stream") == NOTHING_OWED


def test_an_entry_that_kills_its_consumer_every_time_ends_dead(
    manage: Manage, stream: streams.Stream
) -> None:
    healthy = [{"id": f"ok-{n}", "type": "effect.write", "body": {"n": n}} for n in range(10)]
    poison = {"id": "poison", "type": "effect.write", "body": {"kill": "always"}}
    streams.publish(stream, [healthy[0], poison, *healthy[1:]])

    # Each new consumer claims what the killed one read once the lease of "effects" (2 s)
    # has passed since.
    kills = restart_until_it_survives(
        lambda: consume(manage, stream, "--until-idle", "5", consumer="effects"), bound=10
    )

    row = InboxMessage.objects.get(consumer="effects", message_id="poison")
    print(f"consumer killed {kills} times; poison {row.status} after {row.attempts} attempts")
    assert (row.status, row.attempts) == (Status.DEAD, 3)
    assert row.errors[0]["type"] == "LostAttempt"
    assert lost_and_doubled({m["id"] for m in healthy}, "effects") == (0, 0)
    assert streams.owed(stream, "effects") == NOTHING_OWED


def test_sigterm_gives_back_what_was_read_at_once(manage: Manage, stream: streams.Stream) -> None:
    messages, expected = brokers.stream(200, seed=34, sleep=0.05)
    streams.publish(stream, messages)
    proc = consume(manage, stream, "--prefetch", "100")
    deadline = time.monotonic() + 60
    while InboxMessage.objects.filter(consumer="stream").count() < 20:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)

    proc.send_signal(signal.SIGTERM)
    # Counted after the signal: at most the message at hand commits after this count.
    at_signal = InboxMessage.objects.filter(consumer="stream").count()
    out = finish(proc, timeout=30)
    done = InboxMessage.objects.filter(consumer="stream").count()
    print(f"stopped with {done - at_signal} more rows: {out}")
    assert 0 < done <= at_signal + 1
    assert brokers.summary_counts(out)["requeued"] > 0, out

    finish(consume(manage, stream, "--until-idle", "4"))
    assert lost_and_doubled(expected, "stream") == (0, 0)
    assert streams.owed(stream, "stream") == NOTHING_OWED
    consumers = stream.client().xinfo_consumers(stream.name, "stream")
    # The drain's consumer left the group at its graceful stop; the stopped one stays (what it
    # gave back was in its name until claimed) and holds nothing.
    assert [consumer["pending"] for consumer in consumers] == [0]


def test_a_refusal_whose_copy_cannot_be_kept_is_not_acknowledged(
    manage: Manage, stream: streams.Stream
) -> None:
    """<stream>:dead holds a string: the copy fails, so the entry is not acknowledged. It stays
    pending (claimed again after each lease, and refused again, logged each time) while the
    consumer goes on with the others."""
    stream.client().set(f"{stream.name}:dead", "not a stream")
    healthy, expected = brokers.stream(20, seed=35)
    streams.publish(stream, [{"id": None, "type": "effect.write", "body": {}}, *healthy])

    proc = consume(manage, stream)
    deadline = time.monotonic() + 60
    while lost_and_doubled(expected, "stream")[0]:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    time.sleep(3)  # past the 2 s lease: the refused entry has been claimed and tried again
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)

    assert proc.returncode == 0, err[-3000:]
    assert lost_and_doubled(expected, "stream") == (0, 0), out
    assert err.count("could not acknowledge or refuse a message") >= 2, err[-3000:]
    assert streams.owed(stream, "stream") == {"lag": 0, "pending": 1}


def test_no_declare_needs_the_group_and_a_key_of_another_type_is_refused(
    manage: Manage, stream: streams.Stream
) -> None:
    proc = consume(manage, stream, "--no-declare")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "has no consumer group 'stream'" in err

    stream.client().set(stream.name, "a string")
    proc = consume(manage, stream)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "holds no stream" in err
