"""inbox_consume on SQS (``sqs+native://``) against a local SQS-compatible server (moto's server
mode): real boto3 requests, real inbox_consume processes.

Each receive hides the messages for the consumer's lease (2 s for "stream"), so a killed
consumer's messages come back after it. Every test ends with lost 0, doubled 0 and an empty
queue.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable, Iterator

import pytest

from django_inbox.models import InboxMessage
from tests import brokers
from tests import sqs_support as sqs
from tests.conftest import kill_at_random, restart_until_it_survives
from tests.effects import lost_and_doubled

pytestmark = [pytest.mark.server_db, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
Status = InboxMessage.Status
finish = brokers.finish


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with sqs.sqs_server() as found:
        yield found


def consume(
    manage: Manage, queue: sqs.Queue, *args: str, consumer: str = "stream", **env: str
) -> subprocess.Popen[str]:
    return manage(
        "inbox_consume", "--consumer", consumer, "--queue", queue.name,
        "--broker", queue.broker, *args, env=env,
    )  # fmt: skip


def test_duplicates_and_sigkilled_consumers_apply_each_effect_once(
    manage: Manage, endpoint: str
) -> None:
    queue = sqs.new_queue(endpoint, max_receives=50)
    # 500 ids (about 900 messages): the local server scans its whole queue on every receive,
    # and its CPU, not the inbox's, would set the pace of a larger run.
    messages, expected = brokers.stream(500, seed=41, sleep=0.02)
    sqs.send(queue, messages)

    kills = kill_at_random(lambda: consume(manage, queue, "--until-idle", "8"), random.Random(41))
    finish(consume(manage, queue, "--until-idle", "5"))  # what the last kills left hidden
    finish(manage("inbox_process", "--consumer", "stream", "--until-idle", "3"))

    lost, doubled = lost_and_doubled(expected, "stream")
    left = sqs.depth(queue.url, endpoint)
    in_progress = InboxMessage.objects.filter(status=Status.IN_PROGRESS).count()
    print(f"sqs chaos: {len(messages)} sent, kills={kills} lost={lost} doubled={doubled} "
          f"in_progress={in_progress} left={left}")  # fmt: skip
    assert kills >= 10
    assert (lost, doubled, in_progress, left) == (0, 0, 0, 0)
    assert queue.dead_letters and sqs.depth(queue.dead_letters, endpoint) == 0


def test_a_fifo_queue_gives_its_group_as_the_key_and_its_deduplication_id_as_the_id(
    manage: Manage, endpoint: str
) -> None:
    queue = sqs.new_queue(endpoint, fifo=True)
    sent = [
        {"dedup": f"order-1-v{n}", "group": "order-1", "type": "effect.write", "body": {"n": n}}
        for n in range(5)
    ] + [{"id": "named", "dedup": "d-named", "group": "order-2", "type": "effect.write",
          "body": {"n": 9}}]  # fmt: skip
    sqs.send(queue, sent)
    out = finish(consume(manage, queue, "--until-idle", "3"))
    # The same deduplication id sent again once SQS's five-minute window has passed reaches
    # the consumer: the inbox answers it (the window is SQS's; here a new queue stands in for
    # the time passed).
    later = sqs.new_queue(endpoint, fifo=True)
    sqs.send(later, [sent[0]])
    again = finish(consume(manage, later, "--until-idle", "3"))
    assert brokers.summary_counts(again)["duplicate"] == 1, again

    rows = {m.message_id: m for m in InboxMessage.objects.filter(consumer="stream")}
    assert set(rows) == {f"order-1-v{n}" for n in range(5)} | {"named"}, out
    assert {rows[f"order-1-v{n}"].key for n in range(5)} == {"order-1"}
    assert rows["named"].key == "order-2"  # the message_id attribute wins over the dedup id
    assert sqs.depth(queue.url, endpoint) == 0


def test_hostile_and_malformed_messages_end_in_their_documented_states(
    manage: Manage, endpoint: str
) -> None:
    queue = sqs.new_queue(endpoint, max_receives=5)
    bad = [
        {"id": "bad-json", "type": "effect.write", "body": '{"sku": '},
        {"id": "deep", "type": "effect.write", "body": "[" * 100_000 + "]" * 100_000},
        {"id": "too-big", "type": "effect.write", "body": {"blob": "x" * 5000}},
        {"id": "xml", "type": "effect.write", "body": "<order/>",
         "attributes": {"content_type": "application/xml"}},
        {"id": "no-type", "body": {"n": 1}},
        {"id": "poison", "type": "effect.write", "body": {"fail_always": True}},
        {"id": None, "type": "effect.write", "body": {"no": "id"}},
    ]  # fmt: skip
    healthy, expected = brokers.stream(100, seed=43)
    sqs.send(queue, bad + healthy)

    out = finish(consume(manage, queue, "--until-idle", "6", INBOX_MAX_PAYLOAD_BYTES="4096"))
    print(out)

    rows = {m.message_id: m for m in InboxMessage.objects.filter(consumer="stream")}
    assert "not valid JSON" in rows["bad-json"].last_error
    assert "nested too deeply" in rows["deep"].last_error
    assert rows["too-big"].last_error.startswith("PayloadTooLarge")
    assert "unsupported content type 'application/xml'" in rows["xml"].last_error
    assert "no event type" in rows["no-type"].last_error
    for message_id in ("bad-json", "deep", "too-big", "xml", "no-type", "poison"):
        assert rows[message_id].status == Status.DEAD, message_id
    assert rows["poison"].attempts == 8
    counts = brokers.summary_counts(out)
    assert (counts["refused"], counts["reconnects"]) == (1, 0), out
    assert queue.dead_letters and sqs.depth(queue.dead_letters, endpoint) == 1  # the refused one
    kept = sqs.client(endpoint).receive_message(
        QueueUrl=queue.dead_letters, MessageAttributeNames=["All"]
    )["Messages"][0]
    reason = kept["MessageAttributes"]["x-inbox-refused"]["StringValue"]
    assert reason.startswith("refused by inbox_consume: "), reason
    assert lost_and_doubled(expected, "stream") == (0, 0)
    assert sqs.depth(queue.url, endpoint) == 0


def test_a_message_that_kills_its_consumer_every_time_ends_dead(
    manage: Manage, endpoint: str
) -> None:
    """ApproximateReceiveCount says a receive is a redelivery: the inbox ends the message dead
    after its attempts, long before the redrive policy's 10 receives."""
    queue = sqs.new_queue(endpoint, max_receives=10)
    healthy = [{"id": f"ok-{n}", "type": "effect.write", "body": {"n": n}} for n in range(10)]
    poison = {"id": "poison", "type": "effect.write", "body": {"kill": "always"}}
    sqs.send(queue, [healthy[0], poison, *healthy[1:]])

    kills = restart_until_it_survives(
        lambda: consume(manage, queue, "--until-idle", "5", consumer="effects"), bound=10
    )

    row = InboxMessage.objects.get(consumer="effects", message_id="poison")
    print(f"consumer killed {kills} times; poison {row.status} after {row.attempts} attempts")
    assert (row.status, row.attempts) == (Status.DEAD, 3)
    assert row.errors[0]["type"] == "LostAttempt"
    assert lost_and_doubled({m["id"] for m in healthy}, "effects") == (0, 0)
    assert sqs.depth(queue.url, endpoint) == 0
    assert queue.dead_letters and sqs.depth(queue.dead_letters, endpoint) == 0


def test_without_a_redrive_policy_refused_messages_go_to_a_refused_queue(
    manage: Manage, endpoint: str
) -> None:
    queue = sqs.new_queue(endpoint)  # no redrive policy
    healthy, expected = brokers.stream(20, seed=44)
    sqs.send(queue, [{"id": None, "type": "effect.write", "body": {"no": "id"}}, *healthy])

    out = finish(consume(manage, queue, "--until-idle", "3"))

    counts = brokers.summary_counts(out)
    assert (counts["refused"], counts["reconnects"]) == (1, 0), out
    refused_url = sqs.client(endpoint).get_queue_url(QueueName=f"{queue.name}-refused")
    assert sqs.depth(refused_url["QueueUrl"], endpoint) == 1
    assert sqs.depth(queue.url, endpoint) == 0
    assert lost_and_doubled(expected, "stream") == (0, 0)


def test_with_no_declare_a_queue_refused_messages_cannot_leave_exits_2(
    manage: Manage, endpoint: str
) -> None:
    queue = sqs.new_queue(endpoint)  # no redrive policy, no <name>-refused

    proc = consume(manage, queue, "--no-declare")
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert "has no redrive policy" in err


def test_a_missing_queue_with_no_declare_exits_2(manage: Manage, endpoint: str) -> None:
    queue = sqs.Queue(endpoint, "inbox-test-missing", "")

    proc = consume(manage, queue, "--no-declare")
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert "NonExistentQueue" in err or "QueueDoesNotExist" in err
