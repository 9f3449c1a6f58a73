"""The tests that restart a broker restart one of their own (``tests.brokers.private_rabbitmq``),
never the machine's RabbitMQ, which every other run on the machine shares."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from kombu import Connection, Queue

from tests import brokers

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_runs_rabbitmqctl_on_the_machines_node() -> None:
    """``rabbitmqctl`` without ``-n`` acts on the machine's node: only ``tests/brokers.py``
    runs it, always with its own node's name."""
    calls = {
        str(path.relative_to(TESTS)): line.strip()
        for path in TESTS.rglob("*.py")
        if path.name != "brokers.py" and path != Path(__file__)
        for line in path.read_text().splitlines()
        if re.search(r"""["']rabbitmqctl["']""", line)
    }
    assert calls == {}


def round_trip(url: str, queue: str) -> str:
    brokers.publish(url, queue, [{"id": "p-1", "type": "effect.write", "body": {"n": 1}}])
    with Connection(url) as connection:
        message = Queue(queue, durable=True)(connection.default_channel).get(no_ack=True)
        assert message is not None
        return str(message.properties["message_id"])


@pytest.mark.slow
def test_a_private_node_restarts_and_the_machines_broker_stays_up() -> None:
    with Connection(brokers.RABBITMQ) as shared:
        shared.ensure_connection(max_retries=3)
        channel = shared.channel()
        with brokers.private_rabbitmq() as node:
            assert node.url != brokers.RABBITMQ
            assert round_trip(node.url, "private-1") == "p-1"

            node.restart_app(pause=0)

            assert round_trip(node.url, "private-2") == "p-1"
            home, port = node.home, int(node.url.rsplit(":", 1)[1].strip("/"))
        # The machine's broker was not restarted: a connection opened before is still open.
        Queue(brokers.new_queue_name(), exclusive=True)(channel).declare()
        channel.close()
    assert not home.exists()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the node is stopped
