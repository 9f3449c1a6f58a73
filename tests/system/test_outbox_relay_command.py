"""``outbox_relay`` as operators run it, real processes against the test database: what it says
while it runs, a broker it cannot reach (``--wait-for-broker``, ``--until-idle``), and a
database without the outbox's table."""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Callable, Iterator

import pytest

from django_inbox.outbox import publish
from django_inbox.outbox.models import OutboxMessage
from tests import brokers

pytestmark = pytest.mark.postgres
Manage = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def closed_port() -> str:
    """An AMQP URL (with a password) on a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"amqp://guest:s3cret@127.0.0.1:{port}//"


@pytest.fixture
def queue() -> Iterator[str]:
    with brokers.declared_queue("outbox-relay") as name:
        yield name


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def test_a_broker_never_reached_exits_2_with_one_line_after_wait_for_broker(
    manage: Manage, closed_port: str, db_url: str
) -> None:
    for n in range(3):
        publish("order.placed", {"n": n}, routing_key="orders")
    code, out, err = finish(
        manage("outbox_relay", "--broker", closed_port, "--wait-for-broker", "1",
               "--until-idle", "0", env={"INBOX_LOG_LEVEL": "WARNING"})
    )  # fmt: skip
    port = closed_port.rsplit(":", 1)[1]
    masked = f"amqp://guest:**@127.0.0.1:{port}"
    assert code == 2, err
    assert "Traceback" not in err and "s3cret" not in err + out
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"CommandError: could not reach the broker at {re.escape(masked)} within \d+s "
        r"\(\w+Error: .*Connection refused\); 3 outbox rows pending; check the URL, or wait "
        r"longer with --wait-for-broker\.",
        last,
    ), last
    # It said so at once, not only when it gave up; its log lines name the broker.
    assert f"outbox_relay: waiting for the broker at {masked}" in err
    assert re.search(rf"broker {re.escape(masked)}\S* unreachable \(\w+Error: .*refused", err), err
    assert set(OutboxMessage.objects.values_list("status", "attempts")) == {("pending", 0)}


def test_until_idle_ends_a_relay_that_never_reached_its_broker_when_nothing_is_pending(
    manage: Manage, closed_port: str, db_url: str
) -> None:
    code, out, err = finish(manage("outbox_relay", "--broker", closed_port, "--until-idle", "0"))
    assert code == 0, err
    assert "was never reached, 0 pending" in out, out


def test_pending_rows_and_a_broker_never_reached_are_not_idle(
    manage: Manage, closed_port: str, db_url: str
) -> None:
    """--until-idle does not end the relay while rows wait for the broker: only
    --wait-for-broker does, with exit 2."""
    OutboxMessage.objects.all().delete()
    publish("order.placed", {}, routing_key="orders")
    code, out, err = finish(
        manage("outbox_relay", "--broker", closed_port, "--until-idle", "0",
               "--wait-for-broker", "2")
    )  # fmt: skip
    assert code == 2 and "1 outbox row pending" in err, (code, out, err)


def test_the_relay_says_what_it_does_and_is_quiet_with_verbosity_0(
    manage: Manage, queue: str, db_url: str
) -> None:
    for n in range(40):
        publish("order.placed", {"n": n}, routing_key=queue)
    unsendable = [publish("bad.event", {"n": n}, routing_key=queue) for n in range(3)]
    # Rows written past publish()'s checks (by an older release): dead at their first attempt.
    OutboxMessage.objects.filter(message_id__in=unsendable).update(headers={"huge": 2**70})
    code, out, err = finish(
        manage("outbox_relay", "--broker", brokers.RABBITMQ, "--batch-size", "10",
               "--until-idle", "1", "--progress-every", "0.01")
    )  # fmt: skip
    assert code == 0, err
    lines = err.strip().splitlines()
    assert lines[0] == (
        "outbox_relay: publishing to amqp://guest:**@127.0.0.1:5672// with publisher "
        "confirms, batches of 10, polling every 0.2s, until idle for 1s"
    ), lines[0]
    progress = [line for line in lines[1:] if line.startswith("outbox_relay: sent ")]
    assert progress, err
    for line in progress:
        assert re.fullmatch(
            r"outbox_relay: sent \d+(, failed \d+ \((\d+ to retry)?(, )?(\d+ dead)?\))? in the "
            r"last [\d.]+s",
            line,
        ), line
    counted = sum(int(line.split()[2].rstrip(",")) for line in progress)
    assert 0 < counted <= 40
    assert out.strip() == "outbox_relay: sent 40; 3 publications failed (0 to be retried, 3 dead)"

    OutboxMessage.objects.all().delete()
    publish("order.placed", {}, routing_key=queue)
    quiet = manage("outbox_relay", "--broker", brokers.RABBITMQ, "--until-idle", "0", "-v", "0")
    assert finish(quiet) == (0, "", "")
    assert OutboxMessage.objects.get().status == "sent"


def test_a_database_without_the_outboxs_table_exits_2_saying_to_migrate(
    manage: Manage, db_url: str
) -> None:
    code, _, err = finish(manage("migrate", "django_inbox_outbox", "zero"))
    assert code == 0, err
    try:
        code, _, err = finish(manage("outbox_relay", "--broker", brokers.RABBITMQ))
        assert code == 2, err
        assert err.strip() == (
            "CommandError: the outbox's table 'django_inbox_outbox_outboxmessage' does not "
            "exist in database 'default': run 'manage.py migrate' first"
        ), err
    finally:
        code, _, err = finish(manage("migrate", "django_inbox_outbox"))
        assert code == 0, err
