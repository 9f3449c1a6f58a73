"""inbox_consume on NATS JetStream: real nats-server, real inbox_consume processes.

Duplicates are published without ``Nats-Msg-Id``, so JetStream stores every copy and the inbox
is what applies each effect once. Every test ends by counting effects (lost 0, doubled 0) and
what the durable consumer still owes (nothing pending, nothing unacknowledged).
"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from django_inbox.broker.transports.nats_messages import durable_name
from django_inbox.models import InboxMessage
from tests import brokers
from tests import nats_support as jetstream
from tests.conftest import kill_at_random, restart_until_it_survives
from tests.effects import effect_counts, lost_and_doubled

pytestmark = [pytest.mark.server_db, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
Status = InboxMessage.Status
finish = brokers.finish


@pytest.fixture
def stream() -> Iterator[jetstream.Stream]:
    found = jetstream.new_stream()
    yield found
    jetstream.delete_stream(found)


def consume(
    manage: Manage, stream: jetstream.Stream, *args: str, consumer: str = "stream", **env: str
) -> subprocess.Popen[str]:
    return manage(
        "inbox_consume", "--consumer", consumer, "--queue", stream.subject,
        "--broker", stream.url, *args, env=env,
    )  # fmt: skip


def owed(stream: jetstream.Stream, consumer: str = "stream") -> dict[str, int]:
    return jetstream.consumer_state(stream, durable_name(consumer))


def test_duplicates_and_sigkilled_consumers_apply_each_effect_once(
    manage: Manage, stream: jetstream.Stream
) -> None:
    """Two consumers share the durable consumer while one of them is SIGKILLed every 1-3 s
    (10 times); what the killed ones held unacknowledged comes back after the lease (2 s for
    "stream") and is answered from the inbox."""
    messages, expected = brokers.stream(1000, seed=21, sleep=0.02)
    jetstream.publish(stream, messages)

    kills = kill_at_random(lambda: consume(manage, stream, "--until-idle", "8"), random.Random(21))
    finish(consume(manage, stream, "--until-idle", "4"))  # what the last kills left
    finish(manage("inbox_process", "--consumer", "stream", "--until-idle", "3"))

    lost, doubled = lost_and_doubled(expected, "stream")
    left = owed(stream)
    in_progress = InboxMessage.objects.filter(status=Status.IN_PROGRESS).count()
    print(f"nats chaos: {len(messages)} published, kills={kills} lost={lost} "
          f"doubled={doubled} in_progress={in_progress} owed={left}")  # fmt: skip
    assert kills >= 10
    assert (lost, doubled, in_progress) == (0, 0, 0)
    assert left == {"pending": 0, "ack_pending": 0}
    assert InboxMessage.objects.filter(consumer="stream", status=Status.COMPLETED).count() == len(
        expected
    )


def test_a_nats_server_killed_and_restarted_mid_run_loses_and_doubles_nothing(
    manage: Manage,
) -> None:
    with jetstream.private_nats() as server:
        stream = jetstream.new_stream(server.url)
        messages, expected = brokers.stream(800, seed=22, sleep=0.005)
        jetstream.publish(stream, messages)
        proc = consume(manage, stream, "--until-idle", "10")
        deadline = time.monotonic() + 60
        while InboxMessage.objects.filter(consumer="stream").count() < 100:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)

        server.kill()  # SIGKILL: JetStream recovers its stream and consumer from disk
        time.sleep(2)
        server.start()
        out = finish(proc)
        left = owed(stream)

    lost, doubled = lost_and_doubled(expected, "stream")
    print(f"nats restarted: {out} lost={lost} doubled={doubled} owed={left}")
    assert "reconnects 0" not in out, out
    assert (lost, doubled) == (0, 0)
    assert left == {"pending": 0, "ack_pending": 0}


def test_kill_after_commit_before_ack_is_answered_as_a_duplicate(
    manage: Manage, stream: jetstream.Stream, tmp_path: Path
) -> None:
    kill_file = tmp_path / "kill-after-commit"
    kill_file.touch()
    body = {"kill_after_commit_file": str(kill_file)}
    jetstream.publish(stream, [{"id": "m-1", "type": "effect.write", "body": body}])

    first = consume(manage, stream, "--until-idle", "3")
    first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    assert InboxMessage.objects.get().status == Status.COMPLETED  # committed, never acked

    second = finish(consume(manage, stream, "--until-idle", "5"))  # after the 2 s lease

    assert brokers.summary_counts(second)["duplicate"] == 1, second
    assert effect_counts("stream") == {"m-1": 1}
    assert owed(stream) == {"pending": 0, "ack_pending": 0}


def test_hostile_and_malformed_messages_end_in_their_documented_states(
    manage: Manage, stream: jetstream.Stream
) -> None:
    bad = [
        {"id": "bad-bytes", "type": "effect.write", "body": b"\xff\xfe\x00 not text"},
        {"id": "bad-json", "type": "effect.write", "body": b'{"sku": '},
        {"id": "deep", "type": "effect.write", "body": b"[" * 100_000 + b"]" * 100_000},
        {"id": "too-big", "type": "effect.write", "body": {"blob": "x" * 5000}},
        {"id": "xml", "type": "effect.write", "body": b"<order/>",
         "headers": {"Content-Type": "application/xml"}},
        {"id": "no-type", "body": {"n": 1}},
        {"id": None, "type": "effect.write", "body": {"no": "id"}},
        {"id": "poison", "type": "effect.write", "body": {"fail_always": True}},
    ]  # fmt: skip
    healthy, expected = brokers.stream(100, seed=23)
    jetstream.publish(stream, bad + healthy)
    # JetStream's own id wins over the headers: a publisher that deduplicates at the stream.
    jetstream.publish(
        stream,
        [{"id": "header-id", "type": "effect.write", "body": {"n": 1},
          "headers": {"Nats-Msg-Id": "nats-id"}}],
    )  # fmt: skip
    # Header values that are not UTF-8 (another language's client can send them): nats-py
    # reads them with replacement characters, so two such ids could read the same. An id is
    # refused; a type keeps the message dead under its id.
    for raw_id in (b"\xff\xfe-1", b"\xff\xfd-1"):
        jetstream.publish_raw(
            stream, [(b"message_id", raw_id), (b"event_type", b"effect.write")], b'{"n": 1}'
        )
    jetstream.publish_raw(
        stream, [(b"message_id", b"bad-type"), (b"event_type", b"effect.\xffwrite")], b"{}"
    )

    out = finish(consume(manage, stream, "--until-idle", "6", INBOX_MAX_PAYLOAD_BYTES="4096"))
    print(out)
    counts = brokers.summary_counts(out)

    rows = {m.message_id: m for m in InboxMessage.objects.filter(consumer="stream")}
    assert "not valid utf-8" in rows["bad-bytes"].last_error
    assert "not valid JSON" in rows["bad-json"].last_error
    assert "nested too deeply" in rows["deep"].last_error
    assert rows["too-big"].last_error.startswith("PayloadTooLarge")
    assert "unsupported content type 'application/xml'" in rows["xml"].last_error
    assert "no event type" in rows["no-type"].last_error
    assert "type or key cannot be read" in rows["bad-type"].last_error
    dead = ("bad-bytes", "bad-json", "deep", "too-big", "xml", "no-type", "poison", "bad-type")
    for message_id in dead:
        assert rows[message_id].status == Status.DEAD, message_id
    assert rows["poison"].attempts == 8
    assert "nats-id" in rows and "header-id" not in rows
    assert not [m for m in rows if "\ufffd" in m], "no id read with replacement characters"
    # The message without an id and the two undecodable ids: refused, each copied with its
    # reason to <subject>.refused (the same stream holds it), then terminated.
    assert (counts["refused"], counts["reconnects"]) == (3, 0), out
    copies = jetstream.refused_copies(stream)
    assert copies and copies[-1]["x-inbox-refused"].startswith("refused by inbox_consume: ")
    lost, doubled = lost_and_doubled(expected, "stream")
    assert (lost, doubled) == (0, 0)
    assert owed(stream) == {"pending": 0, "ack_pending": 0}


def test_a_message_that_kills_its_consumer_every_time_ends_dead(
    manage: Manage, stream: jetstream.Stream
) -> None:
    """JetStream's delivery count says a delivery is a redelivery: the inbox counts the lost
    attempt and ends the message dead after its attempts, instead of a crash loop."""
    healthy = [{"id": f"ok-{n}", "type": "effect.write", "body": {"n": n}} for n in range(10)]
    poison = {"id": "poison", "type": "effect.write", "body": {"kill": "always"}}
    jetstream.publish(stream, [healthy[0], poison, *healthy[1:]])

    kills = restart_until_it_survives(
        lambda: consume(manage, stream, "--until-idle", "6", consumer="effects"), bound=10
    )

    row = InboxMessage.objects.get(consumer="effects", message_id="poison")
    print(f"consumer killed {kills} times; poison {row.status} after {row.attempts} attempts")
    assert (row.status, row.attempts) == (Status.DEAD, 3)
    assert row.errors[0]["type"] == "LostAttempt"
    lost, doubled = lost_and_doubled({m["id"] for m in healthy}, "effects")
    assert (lost, doubled) == (0, 0)
    assert owed(stream, "effects") == {"pending": 0, "ack_pending": 0}


def test_sigterm_finishes_the_message_at_hand_and_gives_the_rest_back(
    manage: Manage, stream: jetstream.Stream
) -> None:
    messages, expected = brokers.stream(200, seed=24, sleep=0.05)
    jetstream.publish(stream, messages)
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
    assert brokers.summary_counts(out)["requeued"] > 0, out  # the rest given back (nak)

    finish(consume(manage, stream, "--until-idle", "4"))
    assert lost_and_doubled(expected, "stream") == (0, 0)
    assert owed(stream) == {"pending": 0, "ack_pending": 0}


def test_a_subject_no_stream_holds_exits_2(manage: Manage) -> None:
    missing = jetstream.Stream(jetstream.NATS, "none", f"inbox-missing-{time.time_ns()}")
    proc = consume(manage, missing, "--wait-for-broker", "5")
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert "no JetStream stream holds subject" in err


def test_a_durable_consumer_of_another_subject_is_refused(
    manage: Manage, stream: jetstream.Stream
) -> None:
    finish(consume(manage, stream, "--until-idle", "0"))  # creates the durable on .events
    other = jetstream.Stream(stream.url, stream.name, f"{stream.name}.other")

    proc = consume(manage, other)
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert "filters" in err and stream.subject in err


def test_no_declare_needs_the_durable_consumer(manage: Manage, stream: jetstream.Stream) -> None:
    proc = consume(manage, stream, "--no-declare")
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert "has no durable consumer 'stream'" in err


def test_wrong_credentials_exit_2_at_once(manage: Manage) -> None:
    with jetstream.private_nats(credentials=("inbox", "right")) as server:
        wrong = jetstream.Stream(server.url.replace(":right@", ":wrong@"), "none", "s.events")
        proc = consume(manage, wrong, "--wait-for-broker", "60")
        _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert "refused the connection" in err and "Authorization" in err
    assert "wrong" not in err  # never the password


def test_a_server_down_is_waited_for_and_a_stop_is_not_held_up(manage: Manage) -> None:
    """nats-py's own connect retries (about two minutes) would hold each attempt, and a
    SIGTERM, that long: the loop's backoff decides, and a stop ends it at once."""
    with jetstream.private_nats() as server:
        stream = jetstream.new_stream(server.url)
        server.kill()
        proc = consume(manage, stream, "--wait-for-broker", "0")
        time.sleep(4)
        assert proc.poll() is None  # waiting, not exited
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out = finish(proc, timeout=30)
        took = time.monotonic() - began

    # A bound for a hang (a connect attempt held the stop 30 s), not a claim of speed.
    assert took < 20, f"stopping took {took:.1f}s"
    assert brokers.summary_counts(out)["reconnects"] >= 1, out


def test_durable_names_never_merge_two_consumers() -> None:
    names = ["billing", "billing.v2", "billing_2ev2", "billing v2", "évt", "a*b", "a>b", "a_b"]
    escaped = [durable_name(name) for name in names]

    assert len(set(escaped)) == len(names)
    assert escaped[0] == "billing"
    assert all(set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-_") for name in escaped)
