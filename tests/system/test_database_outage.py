"""Workers and consumers whose database goes away: restarts, terminated backends, no slots.

A database that restarts is infrastructure, not a handler's failure: workers keep running,
reconnect with backoff, give back the rows they held without counting the attempt, and every
message is applied once (lost = 0, doubled = 0, no attempt used up by the outage).

The restart test runs a PostgreSQL cluster of its own (``initdb`` in a temporary directory,
another port), so that restarting it disturbs nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from django_inbox import store
from django_inbox.models import InboxMessage
from tests.conftest import MANAGE, ROOT
from tests.effects import lost_and_doubled

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
Status = InboxMessage.Status
PG_BIN = (
    Path("/usr/lib/postgresql")
    / (os.listdir("/usr/lib/postgresql")[0] if os.path.isdir("/usr/lib/postgresql") else "15")
    / "bin"
)


# --- a terminated backend in the middle of a handler (the test database) ----------------


def store_effect(message_id: str, **payload: object) -> None:
    assert store(
        consumer="effects", message_id=message_id, event_type="effect.write", payload=payload
    )


def test_a_connection_lost_inside_the_handler_costs_no_attempt(manage, tmp_path: Path) -> None:
    flag = tmp_path / "terminate-once"
    flag.touch()
    store_effect("t-1", terminate_backend_file=str(flag))
    store_effect("t-2")

    proc = manage(
        "inbox_process", "--consumer", "effects", "--until-idle", "2",
        env={"EFFECTS_LEASE": "60"},
    )  # fmt: skip
    _out, err = proc.communicate(timeout=120)

    assert proc.returncode == 0, err[-3000:]
    assert not flag.exists(), "the handler terminated its own database connection"
    row = InboxMessage.objects.get(message_id="t-1")
    assert row.status == Status.COMPLETED
    assert row.attempts == 1, ("the attempt the outage cut short is not counted", row.history, err)
    kinds = [entry["kind"] for entry in row.history]
    assert kinds == ["interrupted"], row.history
    assert lost_and_doubled({"t-1", "t-2"}) == (0, 0)


def test_a_handler_that_always_kills_its_connection_still_ends_dead(manage) -> None:
    store_effect("t-3", terminate_backend="always")

    proc = manage(
        "inbox_process", "--consumer", "effects", "--until-idle", "2",
        env={"EFFECTS_LEASE": "60"},
    )  # fmt: skip
    _out, err = proc.communicate(timeout=180)

    assert proc.returncode == 0, err[-3000:]
    row = InboxMessage.objects.get(message_id="t-3")
    assert row.status == Status.DEAD, (row.status, row.history)
    kinds = [entry["kind"] for entry in row.history]
    # max_attempts (3) interruptions go uncounted; after that they count like failures.
    assert kinds == ["interrupted"] * 3 + ["error"] * 3, kinds
    assert [entry["type"] for entry in row.errors] == ["ConnectionLost"] * 3
    assert row.attempts == 3


def test_a_statement_timeout_counts_as_the_handlers_failure(manage) -> None:
    store_effect("t-4", statement_timeout=True)

    proc = manage("inbox_process", "--consumer", "effects", "--until-idle", "2")
    _out, err = proc.communicate(timeout=120)

    assert proc.returncode == 0, err[-3000:]
    row = InboxMessage.objects.get(message_id="t-4")
    assert row.status == Status.DEAD
    assert row.attempts == 3
    assert [entry["type"] for entry in row.errors] == ["OperationalError"] * 3
    assert "statement timeout" in row.last_error


# --- a private cluster, restarted under running workers ----------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(args: list[str]) -> list[str]:
    if os.geteuid() == 0:  # initdb and the server refuse to run as root
        return ["runuser", "-u", "postgres", "--", *args]
    return args


class Cluster:
    """A throwaway PostgreSQL server: ``initdb``, ``pg_ctl start/restart/stop``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = _free_port()
        self.max_connections = 12

    def run(self, *args: str) -> None:
        done = subprocess.run(_as_postgres(list(args)), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args[0]}: {done.stdout}{done.stderr}"

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.run(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")
        self.start()
        with self.connect(dbname="postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE inbox")

    def pg_ctl(self, action: str, *args: str) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            f"-c max_connections={self.max_connections} -c superuser_reserved_connections=1 "
            "-c fsync=off"
        )
        self.run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"),
            "-o", options, "-w", action, *args,
        )  # fmt: skip

    def start(self) -> None:
        self.pg_ctl("start")

    def restart(self, mode: str) -> None:
        self.pg_ctl("restart", "-m", mode)

    def stop(self) -> None:
        self.pg_ctl("stop", "-m", "immediate")

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/inbox"

    def connect(self, dbname: str = "inbox", **kwargs: object) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, **kwargs
        )


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL's server programs are not in {PG_BIN}")
    # Not under pytest's temporary directory: the server's user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="inbox-test-pg-"))
    root.chmod(0o755)
    server = Cluster(root / "cluster")
    try:
        server.init()
        yield server
    finally:
        if (server.data / "postmaster.pid").exists():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _env(cluster: Cluster, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=cluster.url,
        PYTHONPATH=os.pathsep.join([str(ROOT / "testproject"), str(ROOT)]),
        INBOX_LOG_LEVEL="ERROR",
        **extra,
    )
    return env


def _manage(cluster: Cluster, *args: str, **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(MANAGE), *args],
        env=_env(cluster, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _query(cluster: Cluster, sql: str) -> list[tuple[object, ...]]:
    for _ in range(100):
        try:
            with cluster.connect() as conn:
                return conn.execute(sql).fetchall()
        except psycopg.OperationalError:
            time.sleep(0.2)  # the cluster is restarting
    raise AssertionError("the private cluster did not come back")


def test_workers_survive_database_restarts_and_a_full_connection_table(cluster: Cluster) -> None:
    migrate = _manage(cluster, "migrate", "--verbosity", "0")
    assert migrate.wait(timeout=120) == 0, migrate.stderr.read() if migrate.stderr else ""
    n = 1000
    ids = [f"r-{k:04d}" for k in range(n)]
    fill = _manage(
        cluster, "shell", "-c",
        "from django_inbox import store\n"
        f"for i in {json.dumps(ids)}:\n"
        "    store(consumer='effects', message_id=i, event_type='effect.write', "
        "payload={'sleep': 0.02})",
    )  # fmt: skip
    assert fill.wait(timeout=120) == 0, fill.stderr.read() if fill.stderr else ""

    workers = [
        _manage(cluster, "inbox_process", "--consumer", "effects", EFFECTS_LEASE="120")
        for _ in range(2)
    ]
    time.sleep(2)
    cluster.restart("fast")
    time.sleep(2)
    cluster.restart("immediate")
    time.sleep(2)
    # Take every connection slot but the superuser's reserved one for a few seconds.
    hogs = []
    while True:
        try:
            hogs.append(cluster.connect(dbname="postgres", connect_timeout=2))
        except psycopg.OperationalError:
            break
    time.sleep(3)
    for hog in hogs:
        hog.close()

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        (left,) = _query(
            cluster,
            "SELECT count(*) FROM django_inbox_inboxmessage WHERE status <> 'completed'",
        )[0]
        if left == 0:
            break
        time.sleep(0.5)
    alive = [proc.poll() is None for proc in workers]
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    outputs = [proc.communicate(timeout=60) for proc in workers]

    counts = dict(
        _query(cluster, "SELECT message_id, count(*) FROM effects_effect GROUP BY message_id")
    )
    lost = sum(1 for i in ids if counts.get(i, 0) == 0)
    doubled = sum(1 for c in counts.values() if int(c) > 1)  # type: ignore[call-overload]
    attempts = dict(
        _query(cluster, "SELECT attempts, count(*) FROM django_inbox_inboxmessage GROUP BY 1")
    )
    (interrupted,) = _query(
        cluster,
        "SELECT count(*) FROM django_inbox_inboxmessage WHERE history::text LIKE '%interrupted%'",
    )[0]
    print(
        f"held slots {len(hogs)}; lost={lost} doubled={doubled} attempts={attempts}; "
        f"{interrupted} row(s) interrupted and given back"
    )
    print([err[-2000:] for _, err in outputs])
    assert alive == [True, True], [err[-3000:] for _, err in outputs]
    assert [proc.returncode for proc in workers] == [0, 0], [e[-3000:] for _, e in outputs]
    assert len(hogs) >= cluster.max_connections - 3
    assert (lost, doubled) == (0, 0)
    assert attempts == {1: n}, "no attempt was used up by the outages"
