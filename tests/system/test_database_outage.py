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
from tests import brokers
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


@pytest.mark.parametrize("timeout", ["statement_timeout", "lock_timeout"])
def test_timeouts_of_the_inbox_own_statements_use_up_no_attempt(manage, timeout: str) -> None:
    """Workers whose sessions have a 300 ms ``statement_timeout`` (or ``lock_timeout``) while
    the inbox's table is locked for 3 s: their claims and completions time out (57014,
    55P03). Neither is a handler's failure: the workers keep running, what they held goes back
    uncounted, and every message completes once at attempt 1."""
    from django.db import connection, transaction

    ids = [f"to-{k:03d}" for k in range(300)]
    for message_id in ids:
        store_effect(message_id, sleep=0.01)
    env = {"PGOPTIONS": f"-c {timeout}=300", "EFFECTS_LEASE": "60"}
    args = ("inbox_process", "--consumer", "effects", "--until-idle", "4")
    workers = [manage(*args, env=env) for _ in range(2)]
    deadline = time.monotonic() + 60
    while InboxMessage.objects.filter(status=Status.COMPLETED).count() < 30:
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"LOCK TABLE {InboxMessage._meta.db_table} IN ACCESS EXCLUSIVE MODE")
        time.sleep(3)
    outputs = [proc.communicate(timeout=120) for proc in workers]

    logs = [err[-3000:] for _, err in outputs]
    assert [proc.returncode for proc in workers] == [0, 0], logs
    rows = list(InboxMessage.objects.filter(message_id__in=ids))
    errors = [entry["type"] for row in rows for entry in row.errors]
    interrupted = sum(1 for row in rows for entry in row.history if entry["kind"] == "interrupted")
    print(f"{timeout}: {interrupted} attempt(s) interrupted and given back, errors {errors}")
    assert {row.status for row in rows} == {Status.COMPLETED}
    assert errors == [], "a timeout of the inbox's own statement was taken for the handler's"
    assert {row.attempts for row in rows} == {1}
    assert lost_and_doubled(set(ids)) == (0, 0)


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

    def init(self, *initdb: str) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self.run(
            str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", *initdb
        )  # fmt: skip
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


def _migrate_and_store(cluster: Cluster, ids: list[str], payload: dict[str, object]) -> None:
    """Migrate the private cluster's database and store ``ids`` for consumer ``effects``."""
    migrate = _manage(cluster, "migrate", "--verbosity", "0")
    assert migrate.wait(timeout=120) == 0, migrate.stderr.read() if migrate.stderr else ""
    fill = _manage(
        cluster, "shell", "-c",
        "from django_inbox import store\n"
        f"for i in {json.dumps(ids)}:\n"
        "    store(consumer='effects', message_id=i, event_type='effect.write', "
        f"payload={payload!r})",
    )  # fmt: skip
    assert fill.wait(timeout=120) == 0, fill.stderr.read() if fill.stderr else ""


def _drained(
    cluster: Cluster, workers: list[subprocess.Popen[str]], ids: list[str]
) -> tuple[list[bool], list[tuple[str, str]], int, int, dict[object, object]]:
    """Wait (3 minutes at most) until every row is completed, stop the workers with SIGTERM;
    return whether each was alive until then, their outputs, lost, doubled and the rows by
    attempts."""
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
    return alive, outputs, lost, doubled, attempts


def test_workers_survive_database_restarts_and_a_full_connection_table(cluster: Cluster) -> None:
    n = 1000
    ids = [f"r-{k:04d}" for k in range(n)]
    _migrate_and_store(cluster, ids, {"sleep": 0.02})

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

    alive, outputs, lost, doubled, attempts = _drained(cluster, workers, ids)
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


def test_consumers_workers_and_a_relay_survive_restarts_and_nothing_is_acked_without_its_row(
    cluster: Cluster,
) -> None:
    """The whole intake on the private cluster: two ``inbox_consume`` on a RabbitMQ queue (600
    messages, 30% of them sent more than once), an outbox publisher committing 200 messages
    into that same queue through ``outbox_relay``, and two ``inbox_process`` draining 400 stored
    rows, while the cluster restarts with a fast and then an immediate shutdown. Every message
    the broker handed over and that was acknowledged has its committed row (the queue ends
    empty and no id is missing), each effect once, every outbox row sent."""
    stored = [f"w-{k:04d}" for k in range(400)]
    _migrate_and_store(cluster, stored, {"sleep": 0.01})
    messages, from_broker = brokers.stream(600, sleep=0.005)
    with brokers.declared_queue("inbox-test-restarts") as queue:
        brokers.publish(brokers.RABBITMQ, queue, messages)
        publisher = subprocess.Popen(
            [sys.executable, "-m", "tests.procs", "publish", queue, "200", "1000", "0.03",
             "--through-outages"],
            env=_env(cluster, DJANGO_SETTINGS_MODULE="testproject.settings"),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        until = ("--until-idle", "10")
        consume = ("inbox_consume", "--consumer", "stream", "--queue", queue)
        procs = {
            "relay": _manage(cluster, "outbox_relay", "--broker", brokers.RABBITMQ, *until),
            "consume-0": _manage(cluster, *consume, "--broker", brokers.RABBITMQ, *until),
            "consume-1": _manage(cluster, *consume, "--broker", brokers.RABBITMQ, *until),
            "process-0": _manage(cluster, "inbox_process", *until, EFFECTS_LEASE="60"),
            "process-1": _manage(cluster, "inbox_process", *until, EFFECTS_LEASE="60"),
        }
        time.sleep(3)
        cluster.restart("fast")
        time.sleep(3)
        cluster.restart("immediate")
        published, err = publisher.communicate(timeout=180)
        assert publisher.returncode == 0, err[-3000:]
        outputs = {name: proc.communicate(timeout=300) for name, proc in procs.items()}
        left_in_queue = brokers.queue_depth(brokers.RABBITMQ, queue)

    logs = {name: err[-3000:] for name, (_out, err) in outputs.items()}
    assert {name: proc.returncode for name, proc in procs.items()} == dict.fromkeys(procs, 0), logs
    from_outbox = {line.split()[1] for line in published.splitlines() if line.startswith("commit")}
    assert len(from_outbox) == 200
    effects = dict(
        _query(
            cluster,
            "SELECT consumer || ' ' || message_id, count(*) FROM effects_effect GROUP BY 1",
        )
    )
    expected = {f"stream {i}" for i in from_broker | from_outbox} | {f"effects {i}" for i in stored}
    lost = sorted(key for key in expected if key not in effects)
    doubled = sorted(key for key, n in effects.items() if int(n) > 1)  # type: ignore[call-overload]
    (unsent,) = _query(cluster, "SELECT count(*) FROM django_inbox_outbox_outboxmessage "
                       "WHERE status <> 'sent'")[0]  # fmt: skip
    (unfinished,) = _query(cluster, "SELECT count(*) FROM django_inbox_inboxmessage "
                           "WHERE status <> 'completed'")[0]  # fmt: skip
    print(
        f"{len(expected)} messages ({len(messages)} published with duplicates, 200 through the "
        f"outbox, 400 stored): lost={len(lost)} doubled={len(doubled)} unsent={unsent} "
        f"unfinished={unfinished} left in the queue={left_in_queue}; "
        + "; ".join(f"{name}: {out.strip()[-200:]}" for name, (out, _err) in outputs.items())
    )
    assert (lost, doubled) == ([], []), (lost[:10], doubled[:10])
    assert (unsent, unfinished, left_in_queue) == (0, 0, 0)
    # The restarts reached them while they worked (else the test proves nothing).
    noticed = sorted(name for name, log in logs.items() if "lost the database" in log)
    assert len(noticed) >= 3, (noticed, logs)


# --- a full disk --------------------------------------------------------------------------


@pytest.fixture
def small_disk() -> Iterator[Path]:
    """A 200 MiB filesystem of the test's own (a tmpfs), for a cluster whose disk fills up."""
    if not (PG_BIN / "initdb").exists():
        pytest.fail(f"PostgreSQL's server programs are not in {PG_BIN}")
    root = Path(tempfile.mkdtemp(prefix="inbox-test-disk-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200m,mode=0755", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(
            "this machine does not let the test mount a filesystem of its own (a tmpfs), so "
            f"no disk can be filled: {done.stderr.strip() or done.returncode}"
        )
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _fill(path: Path) -> int:
    """Write ``path`` until the filesystem is full; return the bytes written."""
    written = 0
    chunk = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as filler:
        while True:
            try:
                written += filler.write(chunk)
            except OSError:
                break
    for size in (1 << 16, 1 << 12, 1 << 9):  # the last pages too
        with open(path, "ab", buffering=0) as filler:
            while True:
                try:
                    written += filler.write(b"\0" * size)
                except OSError:
                    break
    return written


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_full_disk_uses_up_no_attempt_and_everything_resumes_once_space_returns(
    small_disk: Path,
) -> None:
    """Workers draining 800 stored messages while the cluster's disk fills up: the writes
    that need space fail ("could not extend file", SQLSTATE 53100), no attempt is used up
    (no row fails or dies), the workers wait with backoff instead of spinning or exiting,
    and once the space is back every message is applied exactly once."""
    server = Cluster(small_disk / "cluster")
    # One 64 MiB WAL segment is enough for the run: a full disk then fails the writes of
    # tables (an ERROR), never the creation of a WAL segment (a PANIC, a crash restart).
    server.init("--wal-segsize=64")
    try:
        n = 800
        ids = [f"d-{k:04d}" for k in range(n)]
        _migrate_and_store(server, ids, {"sleep": 0.02, "pad": "x" * 500})

        # 8 free interruptions (the default max_attempts) for the row a worker was running:
        # backoff from 0.5 s allows about 5 tries in the 12 s of full disk.
        env = {"EFFECTS_LEASE": "120", "EFFECTS_MAX_ATTEMPTS": "8"}
        args = ("inbox_process", "--consumer", "effects")
        workers = [_manage(server, *args, **env) for _ in range(2)]
        done_before = _wait_for_completed(server, 100)
        filled = _fill(small_disk / "filler")
        time.sleep(1)  # what was running when the disk filled ends
        (before,) = _query(
            server,
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'inbox'",
        )[0]
        cpu_before = [_cpu_seconds(proc.pid) for proc in workers]
        time.sleep(12)
        (after,) = _query(
            server,
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'inbox'",
        )[0]
        cpu_full = [_cpu_seconds(proc.pid) - c for proc, c in zip(workers, cpu_before, strict=True)]
        alive_while_full = [proc.poll() is None for proc in workers]
        stuck = dict(
            _query(server, "SELECT status, count(*) FROM django_inbox_inboxmessage GROUP BY 1")
        )
        (small_disk / "filler").unlink()

        alive, outputs, lost, doubled, attempts = _drained(server, workers, ids)
    finally:
        (small_disk / "filler").unlink(missing_ok=True)
        if (server.data / "postmaster.pid").exists():
            server.stop()  # before its filesystem is unmounted
    transactions = int(after) - int(before)  # type: ignore[call-overload]
    logs = [err[-3000:] for _, err in outputs]
    print(
        f"filled {filled / 2**20:.0f} MiB after {done_before} completed; while full: "
        f"{transactions} transactions in 12 s, worker CPU {cpu_full}, statuses {stuck}; "
        f"after: lost={lost} doubled={doubled} attempts={attempts}"
    )
    assert alive_while_full == [True, True] and alive == [True, True], logs
    assert [proc.returncode for proc in workers] == [0, 0], logs
    assert any("could not extend file" in log or "No space left" in log for log in logs), logs
    assert not {"failed", "dead"} & set(stuck), ("a full disk used up attempts", stuck)
    # Waiting, not spinning: backoff (0.5 s doubling) allows a few tries a worker in 12 s;
    # a loop that retried at once would run hundreds of transactions.
    assert transactions < 200, transactions
    assert (lost, doubled) == (0, 0)
    assert attempts == {1: n}, "no attempt was used up by the full disk"


def _wait_for_completed(server: Cluster, n: int, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        (done,) = _query(
            server, "SELECT count(*) FROM django_inbox_inboxmessage WHERE status = 'completed'"
        )[0]
        if int(done) >= n:  # type: ignore[call-overload]
            return int(done)  # type: ignore[call-overload]
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} messages completed in {timeout:.0f} s")
