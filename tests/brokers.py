"""Publishing test streams to the real brokers on 127.0.0.1, and a RabbitMQ node of a test's
own (:func:`private_rabbitmq`) for the tests that restart their broker."""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kombu import Connection, Queue

RABBITMQ = os.environ.get("INBOX_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672//")
REDIS = os.environ.get("INBOX_TEST_REDIS", "redis://127.0.0.1:6379/3")
BROKERS = {"rabbitmq": RABBITMQ, "redis": REDIS}
#: Messages in the default run of the broker stream tests.
STREAM_N = int(os.environ.get("INBOX_TEST_BROKER_N", "2000"))
#: Redis hands an unacknowledged message back after this long (a killed consumer's).
REDIS_OPTIONS = {"visibility_timeout": 5, "unacked_restore_throttle": 1}


def options_for(url: str) -> dict[str, Any]:
    return dict(REDIS_OPTIONS) if url.startswith("redis") else {}


def new_queue_name(prefix: str = "inbox-test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def connect(url: str) -> Connection:
    return Connection(url, transport_options=options_for(url))


def publish(url: str, queue: str, messages: Iterable[dict[str, Any]], **queue_args: Any) -> int:
    """Publish each message: ``{"id", "type", "body", "content_type", "headers"}``."""
    count = 0
    with connect(url) as connection:
        target = Queue(queue, routing_key=queue, durable=True, queue_arguments=queue_args or None)
        producer = connection.Producer()
        target(connection.default_channel).declare()
        for message in messages:
            body = message.get("body")
            if not isinstance(body, (bytes, str)):
                body = json.dumps(body)
            properties: dict[str, Any] = {}
            if message.get("id") is not None:
                properties["message_id"] = message["id"]
            if message.get("type") is not None:
                properties["type"] = message["type"]
            producer.publish(
                body,
                routing_key=queue,
                content_type=message.get("content_type", "application/json"),
                content_encoding=message.get("content_encoding", "utf-8"),
                headers=message.get("headers") or {},
                delivery_mode=2,
                retry=True,
                **properties,
            )
            count += 1
    return count


def stream(n: int, *, seed: int = 1, **payload: Any) -> tuple[list[dict[str, Any]], set[str]]:
    """``n`` unique messages, about 30% of them published 1 to 4 extra times, shuffled."""
    rng = random.Random(seed)
    unique = [
        {"id": f"m-{k:06d}", "type": "effect.write", "body": dict(payload, n=k)} for k in range(n)
    ]
    messages = list(unique)
    for message in unique:
        if rng.random() < 0.3:
            messages.extend([message] * rng.randint(1, 4))
    rng.shuffle(messages)
    return messages, {m["id"] for m in unique}


def queue_depth(url: str, queue: str) -> int:
    with connect(url) as connection:
        bound = Queue(queue, durable=True)(connection.default_channel)
        try:
            return int(bound.queue_declare(passive=True).message_count)
        except connection.channel_errors:
            if url.startswith("redis"):
                return 0  # Redis keeps no empty list: a queue drained to nothing is gone
            raise


def delete_queue(url: str, queue: str) -> None:
    try:
        with connect(url) as connection:
            Queue(queue)(connection.default_channel).delete()
    except Exception:
        pass


@contextmanager
def declared_queue(prefix: str, url: str = RABBITMQ) -> Iterator[str]:
    """A new durable queue on ``url`` (RabbitMQ by default), deleted afterwards."""
    name = new_queue_name(prefix)
    with connect(url) as connection:
        Queue(name, routing_key=name, durable=True)(connection.default_channel).declare()
    try:
        yield name
    finally:
        delete_queue(url, name)


# --- a RabbitMQ node of one's own ---------------------------------------------------------------

#: Where Debian keeps RabbitMQ's own scripts: its /usr/sbin wrappers run them as the rabbitmq
#: user (through su, as root), where a node in a temporary directory of ours can't write.
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")


def _tool(name: str) -> str:
    own = RABBITMQ_BIN / name
    found = str(own) if own.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed")
    return found


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class RabbitNode:
    """A RabbitMQ node of a test's own: its name, AMQP URL and environment (for rabbitmqctl)."""

    name: str
    url: str
    env: dict[str, str]
    home: Path

    def url_at(self, address: str) -> str:
        """Its AMQP URL at one of the addresses it listens on."""
        return self.url.replace("@127.0.0.1:", f"@{address}:", 1)

    def ctl(self, *args: str, timeout: float = 120) -> str:
        """``rabbitmqctl -n NODE ARGS``: raises, with its output, if it fails."""
        done = subprocess.run(
            [_tool("rabbitmqctl"), "-n", self.name, *args],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(
                f"rabbitmqctl -n {self.name} {' '.join(args)} exited {done.returncode}: "
                f"{done.stdout}{done.stderr}{self.log_tail()}"
            )
        return done.stdout

    def restart_app(self, pause: float = 2.0) -> None:
        """Stop the broker (every connection dropped), wait ``pause`` seconds, start it again:
        ``rabbitmqctl stop_app``/``start_app`` on this node, never the machine's."""
        self.ctl("stop_app")
        time.sleep(pause)
        self.ctl("start_app")

    def log_tail(self, lines: int = 40) -> str:
        logs = sorted((self.home / "log").glob("*.log"))
        text = "".join(log.read_text(errors="replace") for log in logs)
        return "\n".join(["", "--- node log ---", *text.splitlines()[-lines:]])


@contextmanager
def private_rabbitmq(
    startup_timeout: float = 120, listen: Sequence[str] = ()
) -> Iterator[RabbitNode]:
    """Start a RabbitMQ node of our own: a unique node name, free ports (AMQP and Erlang
    distribution), its database, logs, configuration, enabled plugins (none) and Erlang cookie
    in a temporary directory, bound to 127.0.0.1 (AMQP also on the addresses in ``listen``,
    where ``guest`` may then log in from outside loopback). Yield it once it accepts
    connections; stop it (``rabbitmqctl -n NODE stop``) and delete the directory at the end.
    The machine's RabbitMQ and its configuration in /etc/rabbitmq are never touched."""
    home = Path(tempfile.mkdtemp(prefix="inbox-rabbitmq-"))
    name = f"inbox-test-{uuid.uuid4().hex[:8]}@localhost"
    port, dist_port = free_port(), free_port()
    listeners = [
        f"listeners.tcp.{k} = {address}:{port}"
        for k, address in enumerate(("127.0.0.1", *listen), start=1)
    ]
    if listen:
        listeners.append("loopback_users = none")
    (home / "rabbitmq.conf").write_text("\n".join(listeners) + "\n")
    (home / "enabled_plugins").write_text("[].\n")
    (home / "rabbitmq-env.conf").write_text("")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))},
        "HOME": str(home),  # the Erlang cookie: a new one, shared by the node and rabbitmqctl
        "RABBITMQ_NODENAME": name,
        # Its listeners are in rabbitmq.conf, which these would override.
        **({} if listen else {"RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1"}),
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": str(home / "mnesia"),
        "RABBITMQ_LOG_BASE": str(home / "log"),
        "RABBITMQ_CONFIG_FILE": str(home / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(home / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(home / "rabbitmq-env.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(home / "enabled_plugins"),
        "RABBITMQ_PID_FILE": str(home / "node.pid"),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }
    output = (home / "server.out").open("w")
    server = subprocess.Popen(
        [_tool("rabbitmq-server")], env=env, cwd=home, stdout=output, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    node = RabbitNode(name, f"amqp://guest:guest@127.0.0.1:{port}//", env, home)
    try:
        node.ctl("wait", str(home / "node.pid"), "--timeout", str(int(startup_timeout)),
                 timeout=startup_timeout + 30)  # fmt: skip
        yield node
    finally:
        try:
            node.ctl("stop", timeout=120)
            server.wait(timeout=120)
        except Exception:
            if server.poll() is None:
                os.killpg(server.pid, 9)  # the whole session: the script, erl and its children
                server.wait()
        output.close()
        shutil.rmtree(home, ignore_errors=True)


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> str:
    """Wait for a command the test started; its stdout, once it exited 0."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out.strip()


def summary_counts(out: str) -> dict[str, int]:
    """The counts of ``inbox_consume``'s last summary line (``acked 12 (processed 10,
    duplicate 2), refused 1, requeued 0, reconnects 0``): each name with its number, the
    outcomes in brackets included."""
    import re

    lines = [line for line in out.splitlines() if line.startswith("inbox_consume: acked")]
    assert lines, f"no summary line in {out!r}"
    return {name: int(number) for name, number in re.findall(r"(\w+) (\d+)", lines[-1])}
