"""PostgreSQL clusters of a test's own: ``initdb`` in a temporary directory, another port, as
the ``postgres`` user when the tests run as root. A test may restart, fill or cut off such a
cluster without disturbing the machine's server, which every other test shares."""

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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from tests.conftest import MANAGE, process_env

PG_BIN = (
    Path("/usr/lib/postgresql")
    / (os.listdir("/usr/lib/postgresql")[0] if os.path.isdir("/usr/lib/postgresql") else "15")
    / "bin"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(args: list[str]) -> list[str]:
    if os.geteuid() == 0:  # initdb and the server refuse to run as root
        return ["runuser", "-u", "postgres", "--", *args]
    return args


class Cluster:
    """A throwaway PostgreSQL server: ``initdb``, ``pg_ctl start/restart/stop``.

    ``listen``: the addresses it listens on (127.0.0.1 always, where the test itself connects);
    ``trusted``: networks besides loopback whose clients it lets in (``pg_hba.conf``).
    """

    def __init__(
        self,
        root: Path,
        *,
        listen: Sequence[str] = (),
        trusted: Sequence[str] = (),
        settings: Sequence[str] = (),
    ) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.max_connections = 12
        self.listen = ("127.0.0.1", *listen)
        self.trusted = tuple(trusted)
        self.settings = tuple(settings)

    def run(self, *args: str) -> None:
        done = subprocess.run(_as_postgres(list(args)), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{args[0]}: {done.stdout}{done.stderr}"

    def init(self, *initdb: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", *initdb
        )  # fmt: skip
        if self.trusted:
            with (self.data / "pg_hba.conf").open("a") as hba:
                for network in self.trusted:
                    hba.write(f"host all all {network} trust\n")
        self.start()
        with self.connect(dbname="postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE inbox")

    def pg_ctl(self, action: str, *args: str) -> None:
        options = " ".join(
            [
                f"-p {self.port} -c listen_addresses={','.join(self.listen)} -k {self.root}",
                f"-c max_connections={self.max_connections} -c superuser_reserved_connections=1",
                "-c fsync=off",
                *(f"-c {setting}" for setting in self.settings),
            ]
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

    def url_at(self, address: str) -> str:
        return f"postgres://postgres@{address}:{self.port}/inbox"

    @property
    def url(self) -> str:
        return self.url_at("127.0.0.1")

    def connect(self, dbname: str = "inbox", **kwargs: object) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=dbname, **kwargs
        )


def require_server_programs() -> None:
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL's server programs are not in {PG_BIN}")


@contextmanager
def private_cluster(**options: object) -> Iterator[Cluster]:
    """A cluster made and started for the block, stopped and deleted after it."""
    require_server_programs()
    # Not under pytest's temporary directory: the server's user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="inbox-test-pg-"))
    root.chmod(0o755)
    server = Cluster(root / "cluster", **options)  # type: ignore[arg-type]
    try:
        server.init()
        yield server
    finally:
        if (server.data / "postmaster.pid").exists():
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


def env_for(url: str, **extra: str) -> dict[str, str]:
    """The environment of a testproject command on the database at ``url``."""
    return {**process_env(url), **extra}


def manage_on(
    url: str, *args: str, prefix: Sequence[str] = (), **extra: str
) -> subprocess.Popen[str]:
    """``manage.py ARGS`` on the database at ``url``; ``prefix`` runs it through another
    command (``ip netns exec NAMESPACE``)."""
    return subprocess.Popen(
        [*prefix, sys.executable, str(MANAGE), *args],
        env=env_for(url, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def command_on(cluster: Cluster, *args: str, **extra: str) -> subprocess.Popen[str]:
    """``manage.py ARGS`` on the cluster's database, from this machine's loopback."""
    return manage_on(cluster.url, *args, **extra)


def query(cluster: Cluster, sql: str) -> list[tuple[object, ...]]:
    for _ in range(100):
        try:
            with cluster.connect() as conn:
                return conn.execute(sql).fetchall()
        except psycopg.OperationalError:
            time.sleep(0.2)  # the cluster is restarting
    raise AssertionError("the private cluster did not come back")


def migrate_and_store(cluster: Cluster, ids: list[str], payload: dict[str, object]) -> None:
    """Migrate the private cluster's database and store ``ids`` for consumer ``effects``."""
    migrate = command_on(cluster, "migrate", "--verbosity", "0")
    assert migrate.wait(timeout=120) == 0, migrate.stderr.read() if migrate.stderr else ""
    if not ids:
        return
    fill = command_on(
        cluster, "shell", "-c",
        "from django_inbox import store\n"
        f"for i in {json.dumps(ids)}:\n"
        "    store(consumer='effects', message_id=i, event_type='effect.write', "
        f"payload={payload!r})",
    )  # fmt: skip
    assert fill.wait(timeout=120) == 0, fill.stderr.read() if fill.stderr else ""


def wait_for_completed(server: Cluster, n: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (done,) = query(
            server, "SELECT count(*) FROM django_inbox_inboxmessage WHERE status = 'completed'"
        )[0]
        if int(done) >= n:  # type: ignore[call-overload]
            return int(done)  # type: ignore[call-overload]
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} messages completed in {timeout:.0f} s")


def drained(
    cluster: Cluster, workers: list[subprocess.Popen[str]], ids: list[str]
) -> tuple[list[bool], list[tuple[str, str]], int, int, dict[object, object]]:
    """Wait (3 minutes at most) until every row is completed, stop the workers with SIGTERM;
    return whether each was alive until then, their outputs, lost, doubled and the rows by
    attempts."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        (left,) = query(
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
        query(cluster, "SELECT message_id, count(*) FROM effects_effect GROUP BY message_id")
    )
    lost = sum(1 for i in ids if counts.get(i, 0) == 0)
    doubled = sum(1 for c in counts.values() if int(c) > 1)  # type: ignore[call-overload]
    attempts = dict(
        query(cluster, "SELECT attempts, count(*) FROM django_inbox_inboxmessage GROUP BY 1")
    )
    return alive, outputs, lost, doubled, attempts
