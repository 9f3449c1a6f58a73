"""The inbox behind PgBouncer in transaction mode (Debian's PgBouncer 1.18, older than its
support for prepared statements there), in front of the machine's PostgreSQL.

Two ``inbox_consume`` on RabbitMQ (with about 30% duplicates) and two ``inbox_process``
draining stored messages, all through a PgBouncer of the test's own: lost 0, doubled 0, with
the settings the "Running at scale" how-to gives, and with the inbox's prepared statements
left on, where it notices the pooler and stops preparing. ``check --database`` says what is
missing (W012) through the pooler, and nothing once it is set.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_inbox import store
from django_inbox.models import InboxMessage
from tests import brokers
from tests.effects import lost_and_doubled

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
Status = InboxMessage.Status
Manage = Callable[..., subprocess.Popen[str]]
PGBOUNCER = Path("/usr/sbin/pgbouncer")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Bouncer:
    """A PgBouncer in transaction mode on a port of its own, to the test database's server."""

    def __init__(self, root: Path, dbname: str) -> None:
        self.root, self.dbname, self.port = root, dbname, _free_port()
        settings = connection.settings_dict
        server_port = settings.get("PORT") or 5432
        (root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host=127.0.0.1 port={server_port} user=postgres\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            # Fewer server connections than clients: transactions of different processes
            # share server connections, as under load.
            "default_pool_size = 2\nmax_client_conn = 200\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {root / 'pgbouncer.log'}\npidfile = {root / 'pgbouncer.pid'}\n"
        )
        command = [str(PGBOUNCER), str(root / "pgbouncer.ini")]
        if os.geteuid() == 0:  # PgBouncer refuses to run as root
            shutil.chown(root, "postgres", "postgres")
            command = ["runuser", "-u", "postgres", "--", *command]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise AssertionError(f"PgBouncer did not start: {self.log()}")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        """Stop PgBouncer (immediate shutdown) and wait until its server connections are
        gone, so that the test database can be dropped."""
        pidfile = self.root / "pgbouncer.pid"
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                )
                if cursor.fetchone()[0] == 0:
                    return
            time.sleep(0.1)


@pytest.fixture
def bouncer(transactional_db: None) -> Iterator[Bouncer]:
    if not PGBOUNCER.exists():
        pytest.fail("PgBouncer is not installed: scripts/test installs Debian's package")
    root = Path(tempfile.mkdtemp(prefix="inbox-test-pgbouncer-"))
    root.chmod(0o755)
    server = Bouncer(root, connection.settings_dict["NAME"])
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def through(manage: Manage, bouncer: Bouncer, *args: str, **env: str) -> subprocess.Popen[str]:
    return manage(*args, env={"DATABASE_URL": bouncer.url, **env})


def consume(manage: Manage, bouncer: Bouncer, queue: str, **env: str) -> subprocess.Popen[str]:
    return through(
        manage, bouncer, "inbox_consume", "--consumer", "stream", "--queue", queue,
        "--broker", brokers.RABBITMQ, "--until-idle", "3", **env,
    )  # fmt: skip


def drain_through_pgbouncer(manage: Manage, bouncer: Bouncer, **env: str) -> dict[str, str]:
    """2 consumers on a RabbitMQ queue and 2 workers on stored rows, all through PgBouncer;
    returns their logs (stderr) by name."""
    messages, expected = brokers.stream(600, sleep=0.002)
    stored = {f"s-{k:04d}" for k in range(400)}
    for message_id in sorted(stored):
        store(consumer="effects", message_id=message_id, event_type="effect.write", payload={})
    with brokers.declared_queue("inbox-test-pgbouncer") as queue:
        brokers.publish(brokers.RABBITMQ, queue, messages)
        procs = {
            **{f"consume-{k}": consume(manage, bouncer, queue, **env) for k in range(2)},
            **{
                f"process-{k}": through(
                    manage,
                    bouncer,
                    "inbox_process",
                    "--consumer",
                    "effects",
                    "--until-idle",
                    "3",
                    **env,
                )
                for k in range(2)
            },
        }
        logs = {}
        for name, proc in procs.items():
            _out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, (name, err[-3000:], bouncer.log())
            logs[name] = err
        assert brokers.queue_depth(brokers.RABBITMQ, queue) == 0
    assert lost_and_doubled(expected, "stream") == (0, 0)
    assert lost_and_doubled(stored, "effects") == (0, 0)
    left = InboxMessage.objects.exclude(status=Status.COMPLETED).values_list("status", flat=True)
    assert not list(left)
    return logs


def test_consumers_and_workers_behind_pgbouncer_with_the_documented_settings(
    manage: Manage, bouncer: Bouncer
) -> None:
    logs = drain_through_pgbouncer(manage, bouncer, INBOX_TEST_POOLED="1")
    assert not any("prepared statement" in log for log in logs.values()), logs


def test_with_prepared_statements_left_on_the_inbox_notices_and_stops_preparing(
    manage: Manage, bouncer: Bouncer
) -> None:
    logs = drain_through_pgbouncer(manage, bouncer, INBOX_LOG_LEVEL="WARNING")
    noticed = [name for name, log in logs.items() if "prepared statement" in log]
    print(f"noticed the pooler: {noticed}")
    assert noticed, "no process met a prepared statement the pooler lost"


def test_the_check_says_what_a_pooler_in_transaction_mode_needs(
    manage: Manage, bouncer: Bouncer
) -> None:
    found = through(manage, bouncer, "check", "--database", "default")
    out, err = found.communicate(timeout=120)
    assert "django_inbox.W012" in out + err, out + err
    assert "INBOX_PREPARED_STATEMENTS = False" in out + err
    assert "DISABLE_SERVER_SIDE_CURSORS" in out + err
    quiet = through(manage, bouncer, "check", "--database", "default", INBOX_TEST_POOLED="1")
    out, err = quiet.communicate(timeout=120)
    assert quiet.returncode == 0 and "W012" not in out + err, out + err
    direct = manage("check", "--database", "default")
    out, err = direct.communicate(timeout=120)
    assert "W012" not in out + err, out + err
