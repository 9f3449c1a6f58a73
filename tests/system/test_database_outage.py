"""Workers and consumers whose database goes away: restarts, terminated backends, no slots.

A database that restarts is infrastructure, not a handler's failure: workers keep running,
reconnect with backoff, give back the rows they held without counting the attempt, and every
message is applied once (lost = 0, doubled = 0, no attempt used up by the outage).

The restart test runs a PostgreSQL cluster of its own (``initdb`` in a temporary directory,
another port), so that restarting it disturbs nothing else.
"""

from __future__ import annotations

import os
import shutil
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
from tests.clusters import (
    Cluster,
    command_on,
    drained,
    env_for,
    migrate_and_store,
    private_cluster,
    query,
    require_server_programs,
    wait_for_completed,
)
from tests.conftest import ROOT
from tests.effects import lost_and_doubled

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
Status = InboxMessage.Status

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


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with private_cluster() as server:
        yield server


def test_workers_survive_database_restarts_and_a_full_connection_table(cluster: Cluster) -> None:
    n = 1000
    ids = [f"r-{k:04d}" for k in range(n)]
    migrate_and_store(cluster, ids, {"sleep": 0.02})

    workers = [
        command_on(cluster, "inbox_process", "--consumer", "effects", EFFECTS_LEASE="120")
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

    alive, outputs, lost, doubled, attempts = drained(cluster, workers, ids)
    (interrupted,) = query(
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
    migrate_and_store(cluster, stored, {"sleep": 0.01})
    messages, from_broker = brokers.stream(600, sleep=0.005)
    with brokers.declared_queue("inbox-test-restarts") as queue:
        brokers.publish(brokers.RABBITMQ, queue, messages)
        publisher = subprocess.Popen(
            [sys.executable, "-m", "tests.procs", "publish", queue, "200", "1000", "0.03",
             "--through-outages"],
            env=env_for(cluster.url, DJANGO_SETTINGS_MODULE="testproject.settings"),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        until = ("--until-idle", "10")
        consume = ("inbox_consume", "--consumer", "stream", "--queue", queue)
        procs = {
            "relay": command_on(cluster, "outbox_relay", "--broker", brokers.RABBITMQ, *until),
            "consume-0": command_on(cluster, *consume, "--broker", brokers.RABBITMQ, *until),
            "consume-1": command_on(cluster, *consume, "--broker", brokers.RABBITMQ, *until),
            "process-0": command_on(cluster, "inbox_process", *until, EFFECTS_LEASE="60"),
            "process-1": command_on(cluster, "inbox_process", *until, EFFECTS_LEASE="60"),
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
        query(
            cluster,
            "SELECT consumer || ' ' || message_id, count(*) FROM effects_effect GROUP BY 1",
        )
    )
    expected = {f"stream {i}" for i in from_broker | from_outbox} | {f"effects {i}" for i in stored}
    lost = sorted(key for key in expected if key not in effects)
    doubled = sorted(key for key, n in effects.items() if int(n) > 1)  # type: ignore[call-overload]
    (unsent,) = query(cluster, "SELECT count(*) FROM django_inbox_outbox_outboxmessage "
                       "WHERE status <> 'sent'")[0]  # fmt: skip
    (unfinished,) = query(cluster, "SELECT count(*) FROM django_inbox_inboxmessage "
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
    require_server_programs()
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
        migrate_and_store(server, ids, {"sleep": 0.02, "pad": "x" * 500})

        # 8 free interruptions (the default max_attempts) for the row a worker was running:
        # backoff from 0.5 s allows about 5 tries in the 12 s of full disk.
        env = {"EFFECTS_LEASE": "120", "EFFECTS_MAX_ATTEMPTS": "8"}
        args = ("inbox_process", "--consumer", "effects")
        workers = [command_on(server, *args, **env) for _ in range(2)]
        done_before = wait_for_completed(server, 100)
        filled = _fill(small_disk / "filler")
        time.sleep(1)  # what was running when the disk filled ends
        (before,) = query(
            server,
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'inbox'",
        )[0]
        cpu_before = [_cpu_seconds(proc.pid) for proc in workers]
        time.sleep(12)
        (after,) = query(
            server,
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'inbox'",
        )[0]
        cpu_full = [_cpu_seconds(proc.pid) - c for proc, c in zip(workers, cpu_before, strict=True)]
        alive_while_full = [proc.poll() is None for proc in workers]
        stuck = dict(
            query(server, "SELECT status, count(*) FROM django_inbox_inboxmessage GROUP BY 1")
        )
        (small_disk / "filler").unlink()

        alive, outputs, lost, doubled, attempts = drained(server, workers, ids)
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
