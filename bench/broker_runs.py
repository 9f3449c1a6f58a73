"""Running one consumer process (``inbox_consume`` or the plain kombu one) and sampling
its CPU and its backend's."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.config import BENCH_DIR, BENCH_DSN, DB_NAME, MANAGE, bench_sql, log
from bench.drain import subprocess_env
from bench.timing import machine_busy, payload, proc_cpu

# ----------------------------------------------------------------------------- 5. consume

CONSUME_SCRIPT = BENCH_DIR / "consume.py"
CONSUME_IDLE = 2  # --until-idle of every consumer: it exits 2 s after the last message
SAMPLE_EVERY = 0.02  # s between two reads of the consumer's and its backend's CPU time


def broker_reachable(url: str) -> str | None:
    """``None`` if the broker answers, else why not."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # any failure means: skip this broker
        return f"{type(exc).__name__}: {exc}"
    return None


class Queues:
    """The broker queues this run declared (all named ``bench-…``), deleted at the end."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []

    def new(self, url: str, label: str) -> str:
        name = f"bench-{label}-{os.getpid()}-{len(self.made)}"
        self.made.append((url, name))
        return name

    def delete_all(self) -> None:
        from kombu import Connection, Queue

        for url, name in self.made:
            try:
                with Connection(url) as conn:
                    queue = Queue(name, routing_key=name, durable=True)(conn.default_channel)
                    queue.declare()  # kombu's virtual transports delete the bindings they know
                    queue.delete()
            except Exception as exc:  # best effort: report, go on with the others
                log(f"   could not delete queue {name} at {url}: {exc}")
        self.made.clear()


def publish(url: str, queue: str, prefix: str, count: int) -> float:
    """Publish ``count`` persistent messages ``{prefix}-{i}`` of type ``bench.take`` into
    ``queue`` (declared here, as the consumers declare it); return messages/s."""
    from kombu import Connection, Queue

    from bench.inbox_handlers import EVENT_TYPE

    began = time.perf_counter()
    with Connection(url) as conn:
        channel = conn.default_channel
        target = Queue(queue, routing_key=queue, durable=True)(channel)
        target.declare()
        target.purge()
        producer = conn.Producer(channel)
        for i in range(count):
            producer.publish(
                json.dumps(payload(i)),
                routing_key=queue,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                message_id=f"{prefix}-{i}",
                type=EVENT_TYPE,
            )
    return count / (time.perf_counter() - began)


def queue_depth(url: str, queue: str) -> int:
    from kombu import Connection, Queue

    with Connection(url) as conn:
        channel = conn.default_channel
        if url.startswith("redis"):  # an empty Redis list does not exist: no passive declare
            return int(channel.client.llen(queue))
        declared = Queue(queue, routing_key=queue, durable=True)(channel)
        return int(declared.queue_declare(passive=True).message_count)


def inbox_rows(status: str) -> tuple[int, dt.datetime | None, dt.datetime | None, int]:
    """(rows, first received_at, last received_at, rows in ``status``) of consumer ``bench``."""
    if status not in ("received", "completed"):
        raise ValueError(status)
    row = bench_sql(
        "SELECT count(*), min(received_at), max(received_at), "
        f"count(*) FILTER (WHERE status = '{status}') "
        "FROM django_inbox_inboxmessage WHERE consumer = 'bench'"
    )[0]
    return int(row[0]), row[1], row[2], int(row[3])


def sessions(conn: psycopg.Connection[Any]) -> int:
    """Sessions ever opened to the bench database (PostgreSQL 14+; counted at connect)."""
    cur = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = %s", [DB_NAME])
    row = cur.fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def server_pids(command: str) -> list[int]:
    """Processes of this machine named ``command`` (the broker's server: its CPU time is read
    from /proc like the consumer's)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == command:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def backend_pids(conn: psycopg.Connection[Any], application_name: str) -> list[int]:
    cur = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application_name]
    )
    return [int(r[0]) for r in cur.fetchall()]


def interpolate(samples: list[tuple[float, ...]], at: float, column: int) -> float | None:
    """Column ``column`` of ``samples`` (sorted by time, column 0) at time ``at``."""
    previous = None
    for sample in samples:
        if sample[0] >= at:
            if previous is None or sample[column] is None or previous[column] is None:
                return sample[column]
            span = sample[0] - previous[0]
            share = (at - previous[0]) / span if span else 1.0
            return previous[column] + share * (sample[column] - previous[column])
        previous = sample
    return previous[column] if previous else None


def run_consumer(
    kind: str,
    url: str,
    queue: str,
    *,
    ack: str = "after-process",
    prefetch: int,
    conn_max_age: str = "none",
    pyspy: Path | None = None,
    cprofile: Path | None = None,
    max_messages: int | None = None,
    commit_every: int | None = None,
) -> dict[str, Any]:
    """Start one consumer subprocess on ``queue`` (already filled) and wait for it to exit.

    ``kind`` ``inbox`` is ``manage.py inbox_consume``, ``plain`` the kombu baseline
    (``bench/consume.py plain``). While it runs, this process reads every 20 ms the CPU time
    of the consumer, of its PostgreSQL backend (found by ``application_name``) and of the
    machine; the figures are taken between the start of the first and of the last message
    (the inbox's ``received_at``, the baseline's own clock), so the consumer's start-up and
    its final idle wait are excluded. Profiled runs (``pyspy``, ``cprofile``) are not timed.
    """
    application_name = f"bench-consume-{kind}-{time.monotonic_ns()}"
    env = subprocess_env()
    env.update(
        INBOX_BROKER_URL=url,
        BENCH_CONN_MAX_AGE=conn_max_age,
        BENCH_DB_APPLICATION_NAME=application_name,
    )
    common = ["--queue", queue, "--broker", url, "--prefetch", str(prefetch)]
    common += ["--until-idle", str(CONSUME_IDLE)]
    if max_messages:
        common += ["--max-messages", str(max_messages)]
    if kind == "inbox" and cprofile is None:
        cmd = [sys.executable, str(MANAGE), "inbox_consume", "--consumer", "bench"]
        cmd += [*common, "--ack", ack]
        if commit_every:
            cmd += ["--commit-every", str(commit_every)]
    else:
        cmd = [sys.executable, str(CONSUME_SCRIPT), kind, *common, "--ack", ack]
        if cprofile is not None:
            cmd += ["--profile", str(cprofile)]
    if pyspy is not None:
        spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--rate", "400", "--idle"]
        cmd = [*spy, "--format", "raw", "-o", str(pyspy), "--", *cmd]
    samples: list[tuple[Any, ...]] = []
    backends: set[int] = set()
    broker_pids = server_pids("redis-server" if url.startswith("redis") else "beam.smp")
    with (
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
        psycopg.connect(BENCH_DSN, autocommit=True) as watch,
    ):
        sessions0 = sessions(watch)
        started = time.time()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        backend: int | None = None
        next_lookup = 0.0
        while proc.poll() is None:
            now = time.time()
            if now >= next_lookup:
                # every sample until the backend is found, then twice a second
                found = backend_pids(watch, application_name)
                backends.update(found)
                backend = found[0] if len(found) == 1 else None
                next_lookup = now + (0.5 if backend else 0.0)
            server = proc_cpu(backend) if backend else None
            broker_cpu = sum(proc_cpu(pid) for pid in broker_pids) if broker_pids else None
            samples.append((now, proc_cpu(proc.pid), server, machine_busy(), broker_cpu))
            time.sleep(SAMPLE_EVERY)
        ended = time.time()
        connections = sessions(watch) - sessions0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{stderr[-2000:]}")
    if kind == "plain":
        found_json = json.loads([s for s in stdout.splitlines() if s.startswith("{")][-1])
        count, first, last = found_json["count"], found_json["first"], found_json["last"]
        completed = count
    else:
        status = "received" if ack == "after-store" else "completed"
        count, first_at, last_at, completed = inbox_rows(status)
        first = first_at.timestamp() if first_at else None
        last = last_at.timestamp() if last_at else None
        if kind == "inbox" and cprofile is None:
            acked = re.search(r"acked (\d+)", stdout)
            if not acked or int(acked.group(1)) != count or "requeued 0" not in stdout:
                raise RuntimeError(f"inbox_consume did not ack every message: {stdout.strip()}")
    if first is None or last is None or last <= first:
        raise RuntimeError(f"{kind} consumer handled {count} messages: {stdout} {stderr[-500:]}")
    window = last - first
    timed = pyspy is None and cprofile is None
    client = server = busy = broker = None
    if timed:
        c0, c1 = interpolate(samples, first, 1), interpolate(samples, last, 1)
        client = c1 - c0 if c0 is not None and c1 is not None else None
        if len(backends) == 1:  # one backend for the whole run: its CPU is the consumer's
            s0, s1 = interpolate(samples, first, 2), interpolate(samples, last, 2)
            # not seen yet at the first message: it connected during that message (or a
            # sample before), so its CPU time then was (about) none
            server = s1 - (s0 or 0.0) if s1 is not None else None
        b0, b1 = interpolate(samples, first, 3), interpolate(samples, last, 3)
        busy = b1 - b0 if b0 is not None and b1 is not None else None
        r0, r1 = interpolate(samples, first, 4), interpolate(samples, last, 4)
        broker = r1 - r0 if r0 is not None and r1 is not None else None
    return {
        "kind": kind,
        "count": count,
        "completed": completed,
        "intervals": count - 1,
        "window_s": window,
        "msg_s": (count - 1) / window,
        "client_cpu_s": client,
        "server_cpu_s": server,
        "machine_busy_s": busy,
        "broker_cpu_s": broker,
        "backends_seen": len(backends),
        "connections_opened": connections,
        "startup_s": first - started,
        "process_wall_s": ended - started,
        "stdout": stdout.strip()[-300:],
    }
