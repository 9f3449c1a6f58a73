"""Ordered consumers with real processes: shuffled versions, racing workers, killed consumers.

Every test ends by reading what the handler committed (``effects.OrderedRun``: key, sequence,
start and end of each run): each key's versions applied once each, in ascending order, and no
two runs of one key overlapping in time.
"""

from __future__ import annotations

import itertools
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from effects.models import OrderedRun

from django_inbox import store
from django_inbox.models import InboxKey, InboxMessage
from tests import brokers
from tests.conftest import kill_at_random
from tests.system.test_consume import finish

pytestmark = [pytest.mark.server_db, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
Status = InboxMessage.Status
CONSUMER = "ordered"


def versions(keys: int, per_key: int, seed: int) -> list[tuple[str, int]]:
    found = [(f"key-{k:02d}", n) for k in range(keys) for n in range(1, per_key + 1)]
    random.Random(seed).shuffle(found)
    return found


def assert_applied_in_order(keys: int, per_key: int) -> None:
    """Every key applied 1..per_key once each, in order, its runs never overlapping."""
    runs: dict[str, list[OrderedRun]] = {}
    for run in OrderedRun.objects.order_by("id"):
        runs.setdefault(run.key, []).append(run)
    assert sorted(runs) == [f"key-{k:02d}" for k in range(keys)]
    for key, done in runs.items():
        assert [run.sequence for run in done] == list(range(1, per_key + 1)), key
        by_start = sorted(done, key=lambda run: run.started)
        for earlier, later in itertools.pairwise(by_start):
            assert earlier.ended <= later.started, (
                f"{key}: {earlier.sequence} ran {earlier.started}-{earlier.ended}, "
                f"{later.sequence} started {later.started}"
            )
        assert InboxKey.objects.get(consumer=CONSUMER, key=key).applied_sequence == per_key
    statuses = set(InboxMessage.objects.filter(consumer=CONSUMER).values_list("status", flat=True))
    assert statuses == {Status.COMPLETED}


def workers(manage: Manage, n: int, *args: str) -> list[subprocess.Popen[str]]:
    return [
        manage("inbox_process", "--consumer", CONSUMER, "--poll-interval", "0.05", *args)
        for _ in range(n)
    ]


def test_shuffled_versions_stored_while_three_workers_run_apply_in_order(manage: Manage) -> None:
    keys, per_key = 12, 40
    running = workers(manage, 3, "--batch-size", "10", "--until-idle", "4")
    for key, sequence in versions(keys, per_key, seed=5):
        store(
            consumer=CONSUMER, message_id=f"{key}-{sequence}", event_type="ordered.apply",
            payload={}, key=key, sequence=sequence,
        )  # fmt: skip
        time.sleep(0.002)
    outputs = [finish(proc) for proc in running]

    print(f"3 workers, {keys} keys x {per_key} shuffled versions: {outputs}")
    assert_applied_in_order(keys, per_key)


def test_workers_racing_on_the_same_keys_never_overlap(manage: Manage) -> None:
    keys, per_key = 3, 30
    for key, sequence in sorted(versions(keys, per_key, seed=1), key=lambda v: v[1]):
        store(
            consumer=CONSUMER, message_id=f"{key}-{sequence}", event_type="ordered.apply",
            payload={"hold": 0.01}, key=key, sequence=sequence,
        )  # fmt: skip

    outputs = [
        finish(proc) for proc in workers(manage, 4, "--batch-size", "5", "--until-idle", "2")
    ]

    print(f"4 workers on {keys} keys: {outputs}")
    assert_applied_in_order(keys, per_key)


@pytest.fixture
def queue() -> Iterator[str]:
    name = brokers.new_queue_name("inbox-ordered")
    yield name
    brokers.delete_queue(brokers.RABBITMQ, name)


def publish_versions(queue: str, keys: int, per_key: int, seed: int) -> None:
    """Each version once, shuffled, and about 20% of them published a second time."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = []
    for key, sequence in versions(keys, per_key, seed):
        message = {
            "id": f"{key}-{sequence}",
            "type": "ordered.apply",
            "body": {"hold": 0.005},
            "headers": {"key": key, "sequence": sequence},
        }
        messages.append(message)
        if rng.random() < 0.2:
            messages.insert(rng.randrange(len(messages) + 1), message)
    brokers.publish(brokers.RABBITMQ, queue, messages)


@pytest.mark.parametrize("extra", [[], ["--commit-every", "20"]], ids=["per-message", "batched"])
def test_ordered_consumption_survives_sigkill_chaos(
    manage: Manage, queue: str, extra: list[str]
) -> None:
    keys, per_key = 12, 40
    publish_versions(queue, keys, per_key, seed=11)
    rng = random.Random(3)

    def start() -> subprocess.Popen[str]:
        return manage(
            "inbox_consume", "--consumer", CONSUMER, "--queue", queue,
            "--broker", brokers.RABBITMQ, "--until-idle", "6", *extra,
        )  # fmt: skip

    kills = kill_at_random(start, rng, kills=8, pause=(0.5, 1.5))
    # What killed consumers left behind: rows made due but not yet run, abandoned claims.
    finish(manage("inbox_process", "--consumer", CONSUMER, "--until-idle", "6"))

    print(f"ordered chaos {extra}: kills={kills}")
    assert kills >= 4
    assert_applied_in_order(keys, per_key)
