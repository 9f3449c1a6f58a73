"""Exactly-once effects across services: publish → relay → RabbitMQ → inbox_consume, with the
relays SIGKILLed at random.

A publisher process commits 600 business transactions that each publish a message, and rolls
back 60 more. Two ``outbox_relay`` processes run meanwhile, one of them SIGKILLed every 0.5 to
2 seconds for 15 seconds and started again. An ``inbox_consume`` process on the other side runs
the ``stream`` consumer's handler, which writes one effect row per run. At the end: every
committed message had its effect exactly once (lost 0, doubled 0), no rolled-back message
reached the broker (phantom 0), each key's messages took effect in the order they were
committed, and the relays' re-publications (the receiver's duplicates) are reported.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from effects.models import Effect
from kombu import Connection, Queue

from django_inbox.models import InboxMessage
from django_inbox.outbox.models import OutboxMessage
from tests import brokers
from tests.sessions import kill_sessions
from tests.system.test_consume import consume

pytestmark = [pytest.mark.server_db, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
ROOT = Path(__file__).resolve().parents[2]
COMMITS, ROLLBACK_EVERY, CHAOS_SECONDS = 600, 10, 15.0


def declare(queue: str, broker: str = brokers.RABBITMQ) -> None:
    with Connection(broker) as connection:
        Queue(queue, routing_key=queue, durable=True)(connection.default_channel).declare()


def delete(queue: str, broker: str = brokers.RABBITMQ) -> None:
    with Connection(broker) as connection:
        Queue(queue)(connection.default_channel).delete()


def test_relays_killed_at_random_lose_nothing_double_nothing_and_publish_no_phantom(
    manage: Manage, subprocess_env: dict[str, str]
) -> None:
    queue = brokers.new_queue_name("outbox-chaos")
    declare(queue)
    rng = random.Random(15)
    lease = {"OUTBOX_LEASE": "2"}

    def relay(*args: str) -> subprocess.Popen[str]:
        return manage(
            "outbox_relay", "--broker", brokers.RABBITMQ, "--batch-size", "10",
            "--poll-interval", "0.05", *args, env=lease,
        )  # fmt: skip

    publisher = subprocess.Popen(
        [sys.executable, "-m", "tests.procs", "publish", queue, str(COMMITS),
         str(ROLLBACK_EVERY), "0.02"],
        env=subprocess_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    consumer = consume(manage, brokers.RABBITMQ, queue)
    try:
        relays = [relay(), relay()]
        kills = 0
        stop = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < stop:
            time.sleep(rng.uniform(0.5, 2.0))
            victim = rng.randrange(len(relays))
            relays[victim].kill()
            relays[victim].wait()
            kills += 1
            relays[victim] = relay()
        out, err = publisher.communicate(timeout=120)
        assert publisher.returncode == 0, err[-3000:]
        for proc in relays:
            proc.kill()
            proc.wait()
        kills += len(relays)
        # What the killed relays held comes back after its lease: a last relay sends it all.
        last = relay("--until-idle", "4")
        last_out, last_err = last.communicate(timeout=300)
        assert last.returncode == 0, last_err[-3000:]
        deadline = time.monotonic() + 120
        while Effect.objects.filter(consumer="stream").count() < COMMITS:
            assert time.monotonic() < deadline, "the consumer did not get every message"
            time.sleep(0.2)
        time.sleep(1.0)  # anything doubled would show up now
        consumer.terminate()
        consumed, consume_err = consumer.communicate(timeout=60)
        assert consumer.returncode == 0, consume_err[-3000:]
    finally:
        delete(queue)

    committed = [line.split()[1:] for line in out.splitlines() if line.startswith("commit ")]
    rolled_back = {line.split()[1] for line in out.splitlines() if line.startswith("rollback ")}
    assert len(committed) == COMMITS and len(rolled_back) == COMMITS // ROLLBACK_EVERY
    ids = [message_id for message_id, _ in committed]
    effects = Counter(Effect.objects.filter(consumer="stream").values_list("message_id", flat=True))
    lost = set(ids) - set(effects)
    doubled = {message_id: n for message_id, n in effects.items() if n > 1}
    phantom = rolled_back & (
        set(effects) | set(OutboxMessage.objects.values_list("message_id", flat=True))
    )
    republished = InboxMessage.objects.filter(consumer="stream").count()
    print(
        f"{COMMITS} committed, {len(rolled_back)} rolled back, {kills} relay kills; "
        f"lost {len(lost)}, doubled {len(doubled)}, phantom {len(phantom)}; consumer: "
        f"{consumed.strip()}; last relay: {last_out.strip()}"
    )
    assert (len(lost), len(doubled), len(phantom)) == (0, 0, 0)
    assert set(effects) == set(ids) and republished == COMMITS
    statuses = Counter(OutboxMessage.objects.values_list("status", flat=True))
    assert statuses == {"sent": COMMITS}
    # Each key's messages took effect in the order they were committed.
    order = list(
        Effect.objects.filter(consumer="stream").order_by("id").values_list("message_id", flat=True)
    )
    key_of = dict(committed)
    for key in sorted(set(key_of.values())):
        in_commit_order = [message_id for message_id, k in committed if k == key]
        assert [m for m in order if key_of[m] == key] == in_commit_order, key


def test_a_relay_killed_between_the_confirm_and_the_mark_publishes_again_and_the_inbox_dedups(
    manage: Manage, subprocess_env: dict[str, str]
) -> None:
    from django_inbox.outbox import publish

    queue = brokers.new_queue_name("outbox-window")
    declare(queue)
    try:
        ids = [publish("effect.write", {"n": n}, routing_key=queue) for n in range(20)]
        dying = subprocess.run(
            [sys.executable, "-m", "tests.procs", "relay-dies-after-confirm", brokers.RABBITMQ],
            env={**subprocess_env, "OUTBOX_LEASE": "1"}, cwd=ROOT, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert dying.returncode == -9, dying.stderr[-3000:]
        # Confirmed by the broker, not marked: still pending, under the dead relay's lease.
        assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"pending"}
        time.sleep(1.2)
        relay = manage("outbox_relay", "--broker", brokers.RABBITMQ, "--until-idle", "1")
        relayed, err = relay.communicate(timeout=120)
        assert relay.returncode == 0, err[-3000:]
        consumer = consume(manage, brokers.RABBITMQ, queue, "--until-idle", "2")
        consumed, err = consumer.communicate(timeout=120)
        assert consumer.returncode == 0, err[-3000:]
    finally:
        delete(queue)
    print(f"after the kill: {relayed.strip()}; {consumed.strip()}")
    assert "sent 20" in relayed
    assert "acked 40 (duplicate 20, processed 20)" in consumed
    effects = Counter(Effect.objects.filter(consumer="stream").values_list("message_id", flat=True))
    assert effects == Counter(ids)
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"sent"}


def test_a_rabbitmq_restart_during_a_relay_run_loses_nothing(
    manage: Manage, rabbitmq_node: brokers.RabbitNode
) -> None:
    """The broker is a node of this test's own: restarting the machine's would break every
    other run that uses it."""
    from django_inbox.outbox import publish

    broker = rabbitmq_node.url
    queue = brokers.new_queue_name("outbox-restart")
    declare(queue, broker)
    ids = []
    try:
        relay = manage(
            "outbox_relay", "--broker", broker, "--batch-size", "10",
            "--poll-interval", "0.05", "--until-idle", "6", env={"OUTBOX_LEASE": "3"},
        )  # fmt: skip
        # The restart runs beside the publishing: rows keep coming due while the broker is
        # down, so the relay meets the outage however long the restart takes (a restart
        # longer than the relay's --until-idle, with nothing published meanwhile, let the
        # relay idle out before it ever saw the broker go).
        restart = threading.Thread(target=rabbitmq_node.restart_app, kwargs={"pause": 2})
        for n in range(300):
            ids.append(publish("effect.write", {"n": n}, routing_key=queue, key=f"k{n % 4}"))
            if n == 100:
                restart.start()
            time.sleep(0.01)
        while restart.is_alive():  # rows stay due during the outage, until the broker is back
            ids.append(publish("effect.write", {"n": len(ids)}, routing_key=queue, key="k0"))
            time.sleep(0.2)
        restart.join()
        relayed, err = relay.communicate(timeout=300)
        assert relay.returncode == 0, err[-3000:]
        consumer = consume(manage, broker, queue, "--until-idle", "2")
        consumed, err = consumer.communicate(timeout=120)
        assert consumer.returncode == 0, err[-3000:]
    finally:
        delete(queue, broker)
    print(f"restart: {relayed.strip()}; {consumed.strip()}")
    assert "reconnected" in relayed
    effects = Counter(Effect.objects.filter(consumer="stream").values_list("message_id", flat=True))
    assert effects == Counter(ids)  # lost 0, doubled 0
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"sent"}


def test_a_relay_whose_database_connection_is_killed_goes_on(manage: Manage) -> None:
    from django.db import connection

    from django_inbox.outbox import publish

    queue = brokers.new_queue_name("outbox-dbkill")
    declare(queue)
    try:
        relay = manage(
            "outbox_relay", "--broker", brokers.RABBITMQ, "--poll-interval", "0.05",
            "--until-idle", "4", env={"OUTBOX_LEASE": "2"},
        )  # fmt: skip
        ids = []
        killed = 0
        for n in range(200):
            ids.append(publish("effect.write", {"n": n}, routing_key=queue))
            # The server ends every other session (as a restart would), again until the relay
            # had one to end.
            if n in (50, 120) or (n > 120 and not killed):
                killed += kill_sessions(connection)
            time.sleep(0.01)
        deadline = time.monotonic() + 60
        while not killed and relay.poll() is None and time.monotonic() < deadline:
            killed += kill_sessions(connection)
            time.sleep(0.1)
        relayed, err = relay.communicate(timeout=300)
        assert relay.returncode == 0, err[-3000:]
        consumer = consume(manage, brokers.RABBITMQ, queue, "--until-idle", "2")
        consumed, err = consumer.communicate(timeout=120)
        assert consumer.returncode == 0, err[-3000:]
    finally:
        delete(queue)
    print(f"database connections killed: {killed}; {relayed.strip()}; {consumed.strip()}")
    assert killed > 0, "the relay's connection was never killed"
    effects = Counter(Effect.objects.filter(consumer="stream").values_list("message_id", flat=True))
    assert effects == Counter(ids)
    assert set(OutboxMessage.objects.values_list("status", flat=True)) == {"sent"}
