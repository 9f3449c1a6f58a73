"""Figure 12 (``./scripts/bench transports``): ``inbox_consume`` on RabbitMQ, NATS JetStream,
Redis Streams and SQS (``sqs+native://``, against moto's server mode) against a plain consumer of
the same client running the same handler (``bench/plain_transports.py``).

For each transport, ``BENCH_TRANSPORTS_RUNS`` (3) interleaved runs of each consumer on
``BENCH_TRANSPORTS_N`` new messages (3,000; 1,000 on SQS, whose local server scans its whole
queue on every receive); each consumer is a subprocess with a persistent database connection
and prefetch 100; its rate runs from its first message to its last (the inbox's
``received_at``, the plain consumer's own clock), so start-up and the final idle wait are
excluded. The broker server's CPU per message is read from ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bench.config import BENCH_DIR, BROKERS, MANAGE, _env_int, bench_sql, log, truncate_inbox
from bench.drain import subprocess_env
from bench.inbox_handlers import EVENT_TYPE
from bench.timing import machine_busy, payload, proc_cpu

N = _env_int("BENCH_TRANSPORTS_N", 3000)
SQS_N = _env_int("BENCH_TRANSPORTS_SQS_N", 1000)
RUNS = _env_int("BENCH_TRANSPORTS_RUNS", 3)
PREFETCH = 100
IDLE = 2.0
TARGET = 0.8
NATS_URL = os.environ.get("BENCH_NATS_URL", "nats://127.0.0.1:4222")
REDIS_URL = os.environ.get("BENCH_REDIS_STREAMS_URL", "redis+streams://127.0.0.1:6379/9")
PLAIN = BENCH_DIR / "plain_transports.py"
#: ``floor``: the plain consumer that also sends the inbox's insert, with no Python of the
#: inbox (what any inbox writing one row per message costs at least).
#: ``batched``: ``inbox_consume --commit-every BATCH``, one transaction for what is waiting.
KINDS = ("inbox", "plain", "floor", "batched")
BATCH = 20


def sqs_client(url: str) -> Any:
    import boto3

    parts = urlsplit(url)
    endpoint = (parse_qs(parts.query).get("endpoint_url") or [None])[0]
    from botocore.config import Config

    return boto3.client(
        "sqs",
        # moto's server can take a while on a busy machine; SQS itself answers at once
        config=Config(read_timeout=300, retries={"max_attempts": 2}),
        region_name=parts.hostname or "eu-west-1",
        endpoint_url=endpoint,
        aws_access_key_id=parts.username or "testing",
        aws_secret_access_key=parts.password or "testing",
    )


# --- filling a queue with n new messages ---------------------------------------------------


def fill_amqp(url: str, queue: str, n: int) -> str:
    from bench.broker_runs import publish

    publish(url, queue, queue, n)
    return queue


def drop_amqp(url: str, queue: str) -> None:
    from kombu import Connection, Queue

    with Connection(url) as conn:
        Queue(queue, routing_key=queue, durable=True)(conn.default_channel).delete()


def fill_nats(subject_root: str, n: int) -> str:
    import nats

    subject = f"{subject_root}.events"

    async def send() -> None:
        client = await nats.connect(NATS_URL)
        js = client.jetstream()
        await js.add_stream(name=subject_root, subjects=[f"{subject_root}.>"])
        for i in range(n):
            headers = {"message_id": f"{subject_root}-{i}", "event_type": EVENT_TYPE}
            await js.publish(subject, json.dumps(payload(i)).encode(), headers=headers)
        await client.close()

    asyncio.run(send())
    return subject


def drop_nats(subject_root: str) -> None:
    import nats

    async def drop() -> None:
        client = await nats.connect(NATS_URL)
        try:
            await client.jetstream().delete_stream(subject_root)
        finally:
            await client.close()

    asyncio.run(drop())


def fill_redis(stream: str, n: int) -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL.replace("+streams://", "://", 1))
    with client.pipeline(transaction=False) as pipe:
        for i in range(n):
            fields = {"message_id": f"{stream}-{i}", "event_type": EVENT_TYPE}
            pipe.xadd(stream, {**fields, "payload": json.dumps(payload(i))})
        pipe.execute()
    return stream


def drop_redis(stream: str) -> None:
    import redis

    redis.Redis.from_url(REDIS_URL.replace("+streams://", "://", 1)).delete(stream)


def fill_sqs(url: str, name: str, n: int) -> str:
    sqs = sqs_client(url)
    queue_url = sqs.create_queue(QueueName=name)["QueueUrl"]
    for start in range(0, n, 10):
        entries = [
            {
                "Id": str(i),
                "MessageBody": json.dumps(payload(i)),
                "MessageAttributes": {
                    "message_id": {"DataType": "String", "StringValue": f"{name}-{i}"},
                    "event_type": {"DataType": "String", "StringValue": EVENT_TYPE},
                },
            }
            for i in range(start, min(start + 10, n))
        ]
        sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
    return name


def drop_sqs(url: str, name: str) -> None:
    sqs = sqs_client(url)
    for queue in (name, f"{name}-refused"):
        with contextlib.suppress(Exception):  # never made (the refused queue): nothing to do
            sqs.delete_queue(QueueUrl=sqs.get_queue_url(QueueName=queue)["QueueUrl"])


# --- one consumer run ------------------------------------------------------------------------


def _run(kind: str, transport: str, url: str, queue: str, server: list[int]) -> dict[str, float]:
    env = {**subprocess_env(), "BENCH_CONN_MAX_AGE": "none"}
    if kind in ("inbox", "batched"):
        cmd = [sys.executable, str(MANAGE), "inbox_consume", "--consumer", "bench"]
        cmd += ["--queue", queue, "--broker", url, "--prefetch", str(PREFETCH)]
        cmd += ["--until-idle", str(IDLE)]
        cmd += ["--commit-every", str(BATCH)] if kind == "batched" else []
    else:
        cmd = [sys.executable, str(PLAIN), transport, url, queue, str(PREFETCH), str(IDLE)]
        cmd += ["floor"] if kind == "floor" else []
    busy0, broker0 = machine_busy(), sum(proc_cpu(pid) for pid in server)
    began = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    wall = time.perf_counter() - began
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-1500:]}")
    if kind in ("plain", "floor"):
        found = json.loads([line for line in done.stdout.splitlines() if line.startswith("{")][-1])
        count, first, last = found["count"], found["first"], found["last"]
    else:
        row = bench_sql(
            "SELECT count(*), extract(epoch FROM min(received_at)), "
            "extract(epoch FROM max(received_at)) FROM django_inbox_inboxmessage "
            "WHERE consumer = 'bench' AND status = 'completed'"
        )[0]
        count, first, last = int(row[0]), float(row[1]), float(row[2])
    return {
        "count": count,
        "msg_s": (count - 1) / (last - first),
        "machine_busy": (machine_busy() - busy0) / (wall * (os.cpu_count() or 1)),
        "broker_cpu_us": (sum(proc_cpu(pid) for pid in server) - broker0) / count * 1e6,
    }


def _pids(name: str) -> list[int]:
    from bench.broker_runs import server_pids

    return server_pids(name)


def _measure(transport: str, sqs_url: str, moto_pid: int) -> dict[str, Any]:
    """RUNS interleaved runs of each of KINDS on ``transport``; their medians and ratios."""
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    for run in range(RUNS):
        # the order alternates, so that a trend in the machine's load favours none
        for kind in KINDS if run % 2 == 0 else KINDS[::-1]:
            truncate_inbox()
            name = f"BENCH_{kind}_{run}_{uuid.uuid4().hex[:6]}"
            if transport == "amqp":
                url = BROKERS["rabbitmq"]
                queue, server = fill_amqp(url, name, N), _pids("beam.smp")
            elif transport == "nats":
                queue, url, server = fill_nats(name, N), NATS_URL, _pids("nats-server")
            elif transport == "redis-streams":
                queue, url, server = fill_redis(name, N), REDIS_URL, _pids("redis-server")
            else:
                queue, url, server = fill_sqs(sqs_url, name, SQS_N), sqs_url, [moto_pid]
            try:
                found = _run(kind, transport, url, queue, server)
            finally:
                if transport == "amqp":
                    drop_amqp(url, name)
                elif transport == "nats":
                    drop_nats(name)
                elif transport == "redis-streams":
                    drop_redis(name)
                else:
                    drop_sqs(url, name)  # moto reads every queue it holds: keep one
            expected = SQS_N if transport == "sqs" else N
            if found["count"] != expected:
                raise RuntimeError(f"{transport} {kind}: {found['count']} of {expected}")
            runs[kind].append(found)
            log(f"   {transport:13} run {run + 1} {kind:7} {found['msg_s']:7.0f} msg/s")
    medians = {
        kind: {key: statistics.median(r[key] for r in found) for key in found[0]}
        for kind, found in runs.items()
    }
    return {
        "medians": medians,
        "runs": runs,
        "ratio": medians["inbox"]["msg_s"] / medians["plain"]["msg_s"],
        "floor": medians["floor"]["msg_s"] / medians["plain"]["msg_s"],
        "batched": medians["batched"]["msg_s"] / medians["plain"]["msg_s"],
    }


def bench_transports() -> dict[str, Any]:
    log(f"12. transports: {N} messages ({SQS_N} on SQS) x {RUNS} interleaved runs of each")
    moto = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        sqs_url = _moto_url(moto)
        results: dict[str, Any] = {}
        for transport in ("amqp", "nats", "redis-streams", "sqs"):
            try:
                results[transport] = _measure(transport, sqs_url, moto.pid)
            except Exception as exc:  # one transport's failure ends its row, not the figure
                log(f"   {transport} failed: {type(exc).__name__}: {exc}")
                results[transport] = {"skipped": f"failed: {type(exc).__name__}: {exc}"[:500]}
    finally:
        moto.kill()
        moto.wait()
    return {
        "n": N,
        "sqs_n": SQS_N,
        "runs": RUNS,
        "batch": BATCH,
        "transports": results,
        "target": TARGET,
    }


def _moto_url(moto: subprocess.Popen[str]) -> str:
    """moto prints the address it serves; read its port from there."""
    assert moto.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = moto.stdout.readline()
        if "Running on http://127.0.0.1:" in line:
            port = line.rsplit(":", 1)[1].strip().split()[0].strip("/")
            return f"sqs+native://testing:testing@eu-west-1?endpoint_url=http://127.0.0.1:{port}"
    raise RuntimeError("moto's server did not start")


def render_transports(data: dict[str, Any]) -> str:
    names = {
        "amqp": "RabbitMQ (`amqp://`, kombu)",
        "nats": "NATS JetStream (`nats://`)",
        "redis-streams": "Redis Streams (`redis+streams://`)",
        "sqs": "SQS (`sqs+native://`, moto's server)",
    }
    if "transports" not in data:
        return f"## 12. Transports\n\nNot measured: {data.get('skipped', 'no data')}\n"
    rows = []
    for transport, found in data["transports"].items():
        if "medians" not in found:
            rows.append(f"| {names[transport]} | {found.get('skipped', '-')} |||||||")
            continue
        inbox, plain = found["medians"]["inbox"], found["medians"]["plain"]
        reached = "reached" if found["ratio"] >= data["target"] else "**missed**"
        floor = found["medians"].get("floor")
        floor_text = (
            f"{floor['msg_s']:,.0f} ({found['floor']:.2f})" if floor and "floor" in found else "-"
        )
        batched = found["medians"].get("batched")
        batched_text = (
            f"{batched['msg_s']:,.0f} ({found['batched']:.2f})"
            if batched and "batched" in found
            else "-"
        )
        rows.append(
            f"| {names[transport]} | {inbox['msg_s']:,.0f} | {plain['msg_s']:,.0f} "
            f"| {found['ratio']:.2f} ({reached}) | {floor_text} | {batched_text} "
            f"| {inbox['broker_cpu_us']:,.0f} µs "
            f"| {inbox['machine_busy']:.0%} / {plain['machine_busy']:.0%} |"
        )
    return "\n".join(
        [
            "## 12. Transports: `inbox_consume` against a plain consumer of the same client",
            "",
            f"{data['n']:,} new messages per run ({data['sqs_n']:,} on SQS), median of "
            f"{data['runs']} interleaved runs; prefetch 100; each message one single-row "
            "UPDATE in `atomic()`, acknowledged after the commit (the plain consumer: "
            "`close_old_connections()`, `json.loads`, the handler, the ack). The floor is the "
            "plain consumer sending the inbox's insert too (raw, prepared) with no Python of "
            "the inbox: "
            "the part of the inbox's cost that is its one statement per message, whatever its "
            "Python. `inbox_consume` holds the acknowledgements of committed messages and sends "
            "them in one call per batch where the broker allows it (Redis `XACK`, SQS "
            "`DeleteMessageBatch`, JetStream's acks in one hop to the client's thread); the "
            "plain consumer and the floor acknowledge each message, as a consumer without "
            "deduplication should (there, an ack lost in a crash is a handler run twice). "
            f"`--commit-every {data.get('batch', BATCH)}` runs what is already waiting in one "
            "transaction (one insert for the batch, one commit): the design that moves the "
            "floor, opt-in because a failing handler makes the batch's other handlers run "
            "again, each in its own transaction.",
            "",
            "| transport | inbox_consume msg/s | plain msg/s | inbox / plain (target "
            f"{data['target']:.2f}) | floor msg/s (floor / plain) "
            f"| `--commit-every {data.get('batch', BATCH)}` msg/s (/ plain) "
            "| broker server CPU per message (inbox) | machine busy (inbox / plain) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
