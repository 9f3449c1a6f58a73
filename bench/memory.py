"""Peak memory of ``manage.py inbox_consume --prefetch 100``: on a large backlog of small
messages, and on large messages.

Each scenario fills a fresh RabbitMQ queue (``bench-mem-…``, deleted at the end), then starts
the consumer as a subprocess and reads its ``VmRSS`` and ``VmHWM`` from ``/proc/<pid>/status``
every 0.2 s. The budget is what the consumer may hold: ``prefetch x message size + 60 MiB``.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.broker_runs import Queues, broker_reachable, queue_depth
from bench.config import BROKERS, MANAGE, _env_int, bench_sql, log, truncate_inbox
from bench.drain import subprocess_env
from bench.timing import payload

BACKLOG = _env_int("BENCH_MEMORY_BACKLOG", 1_000_000)
SECONDS = _env_int("BENCH_MEMORY_SECONDS", 60)
LARGE_BYTES = _env_int("BENCH_MEMORY_LARGE_BYTES", 10 * 2**20)
LARGE_COUNT = 150
PREFETCH = 100
OVERHEAD = 60 * 2**20  # the budget's allowance for the interpreter, Django and kombu
SAMPLE_EVERY = 0.2
LARGE_TIMEOUT = 900.0  # s the large-message consumer may take to drain its queue
STOP_TIMEOUT = 30.0  # s between SIGTERM and SIGKILL
MIB = 2**20


def publish_fast(url: str, queue: str, prefix: str, bodies: Any, count: int) -> dict[str, Any]:
    """Publish ``count`` persistent JSON messages on one channel, without confirms;
    ``bodies(i)`` is message ``i``'s body. Return the rate and the largest body."""
    from amqp import Message
    from kombu import Connection, Queue

    from bench.inbox_handlers import EVENT_TYPE

    largest = 0
    began = time.perf_counter()
    # py-amqp gives up a connection whose writes the peer has not acknowledged within 1 s
    # (TCP_USER_TIMEOUT); RabbitMQ's flow control may hold a fast unconfirmed publisher of a
    # million persistent messages longer than that.
    with Connection(
        url, transport_options={"socket_settings": {socket.TCP_USER_TIMEOUT: 120_000}}
    ) as conn:
        channel = conn.default_channel
        Queue(queue, routing_key=queue, durable=True)(channel).declare()
        for i in range(count):
            body = bodies(i)
            largest = max(largest, len(body))
            message = Message(
                body,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
                message_id=f"{prefix}-{i}",
                type=EVENT_TYPE,
            )
            channel.basic_publish(message, exchange="", routing_key=queue)
    wall = time.perf_counter() - began
    return {"published": count, "publish_msg_s": round(count / wall, 1), "body_bytes": largest}


def memory_kib(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of ``pid`` in KiB, ``None`` once it has exited."""
    found: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0])
    except (OSError, ValueError):
        return None
    return (found["VmRSS"], found["VmHWM"]) if len(found) == 2 else None


def processed() -> tuple[int, float | None]:
    """Completed rows, and their rate from the first received to the last processed."""
    count, span = bench_sql(
        "SELECT count(*), extract(epoch FROM max(processed_at) - min(received_at)) "
        "FROM django_inbox_inboxmessage WHERE status = 'completed'"
    )[0]
    return int(count), round(int(count) / float(span), 1) if span else None


def watch_consumer(
    url: str, queue: str, *, seconds: float, until_idle: bool, extra_env: dict[str, str]
) -> dict[str, Any]:
    """Run ``inbox_consume`` on ``queue`` for ``seconds`` (or until it exits after the queue
    went idle), sampling its memory; stop it with SIGTERM, then SIGKILL."""
    from bench.inbox_handlers import CONSUMER

    env = subprocess_env()
    env.pop("BENCH_MAX_PAYLOAD_BYTES", None)
    env.update(INBOX_BROKER_URL=url, BENCH_CONN_MAX_AGE="none", **extra_env)
    cmd = [sys.executable, str(MANAGE), "inbox_consume", "--consumer", CONSUMER]
    cmd += ["--queue", queue, "--broker", url, "--prefetch", str(PREFETCH)]
    if until_idle:
        cmd += ["--until-idle", "2"]
    samples: list[tuple[float, int, int]] = []
    first_rss: int | None = None
    first_at: float | None = None
    killed = False
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        try:
            while proc.poll() is None and time.perf_counter() - started < seconds:
                found = memory_kib(proc.pid)
                if found and found[0]:  # 0 while the child is still being exec'd
                    samples.append((time.perf_counter() - started, *found))
                    if (
                        first_rss is None
                        and bench_sql("SELECT EXISTS (SELECT 1 FROM django_inbox_inboxmessage)")[0][
                            0
                        ]
                    ):
                        first_rss, first_at = found[0], samples[-1][0]
                time.sleep(SAMPLE_EVERY)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    killed = True
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().strip(), err.read().strip()
    if not samples:
        raise RuntimeError(f"inbox_consume exited at once ({proc.returncode}): {stderr[-1000:]}")
    peak = max(max(s[1] for s in samples), samples[-1][2]) * 1024
    count, rate = processed()
    return {
        "prefetch": PREFETCH,
        "wall_s": round(wall, 1),
        "exit_code": proc.returncode,
        "killed": killed,
        "processed": count,
        "msg_s": rate,
        "left_in_queue": queue_depth(url, queue),
        "first_message_s": round(first_at, 2) if first_at is not None else None,
        "rss_at_first_message_mib": round(first_rss / 1024, 1) if first_rss else None,
        "peak_rss_mib": round(peak / MIB, 1),
        "growth_after_first_message_mib": round((peak / 1024 - first_rss) / 1024, 1)
        if first_rss
        else None,
        "peak_rss_bytes": peak,
        "samples": len(samples),
        "rss_mib_every_5s": [round(s[1] / 1024, 1) for s in samples[:: int(5 / SAMPLE_EVERY)]],
        "stdout": stdout[-300:],
        "stderr": stderr[-300:] if proc.returncode else "",
    }


def budget(found: dict[str, Any], body_bytes: int) -> None:
    """Add the budget (prefetch x message size + 60 MiB) and whether the peak stayed in it."""
    allowed = PREFETCH * body_bytes + OVERHEAD
    found["budget_mib"] = round(allowed / MIB, 1)
    found["within_budget"] = found["peak_rss_bytes"] <= allowed


def large_body(i: int) -> bytes:
    head = json.dumps({**payload(i), "pad": ""}).encode()
    return head[:-2] + b"x" * max(0, LARGE_BYTES - len(head)) + head[-2:]


def bench_memory() -> dict[str, Any]:
    """Peak RSS of ``inbox_consume`` on a backlog of small messages and on large ones."""
    url = BROKERS["rabbitmq"]
    log(
        f"\n== memory of inbox_consume --prefetch {PREFETCH}: a backlog of {BACKLOG:,} small "
        f"messages ({SECONDS}s), {LARGE_COUNT} messages of {LARGE_BYTES / MIB:.1f} MiB"
    )
    why = broker_reachable(url)
    if why:
        log(f"   rabbitmq at {url} is not reachable ({why}): skipped")
        return {"skipped": f"RabbitMQ not reachable ({why})"}
    queues = Queues()
    out: dict[str, Any] = {"prefetch": PREFETCH, "overhead_mib": OVERHEAD // MIB}
    stamp = int(time.time())
    try:
        truncate_inbox()
        queue = queues.new(url, "mem-backlog")
        sent = publish_fast(
            url, queue, f"mem{stamp}", lambda i: json.dumps(payload(i)).encode(), BACKLOG
        )
        log(f"   published {BACKLOG:,} small messages at {sent['publish_msg_s']:,.0f}/s")
        found = watch_consumer(url, queue, seconds=SECONDS, until_idle=False, extra_env={})
        budget(found, sent["body_bytes"])
        out["backlog"] = {**sent, **found, "seconds": SECONDS}
        log(
            f"   backlog: RSS {found['rss_at_first_message_mib']} MiB at the first message, "
            f"peak {found['peak_rss_mib']} MiB (budget {found['budget_mib']} MiB), "
            f"{found['processed']:,} processed in {found['wall_s']}s"
        )
        truncate_inbox()
        queue = queues.new(url, "mem-large")
        sent = publish_fast(url, queue, f"mem{stamp}-large", large_body, LARGE_COUNT)
        log(f"   published {LARGE_COUNT} large messages at {sent['publish_msg_s']:,.1f}/s")
        limit = {"BENCH_MAX_PAYLOAD_BYTES": str(LARGE_BYTES + MIB)}
        found = watch_consumer(url, queue, seconds=LARGE_TIMEOUT, until_idle=True, extra_env=limit)
        budget(found, sent["body_bytes"])
        out["large"] = {**sent, **found, "max_payload_bytes": LARGE_BYTES + MIB}
        log(
            f"   large: peak {found['peak_rss_mib']} MiB (budget {found['budget_mib']} MiB), "
            f"{found['processed']} of {LARGE_COUNT} processed in {found['wall_s']}s"
        )
    finally:
        queues.delete_all()
        truncate_inbox()
    return out


def render_memory(data: dict[str, Any]) -> str:
    """Markdown: one row per scenario, peak RSS against its budget."""
    lines = ["## Peak memory of inbox_consume", ""]
    if "skipped" in data:
        return "\n".join([*lines, f"Not measured: {data['skipped']}.", ""])
    lines += [
        "| scenario | message | RSS at 1st message | peak RSS | budget | within | processed |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for key, label in (("backlog", "backlog of {published:,}"), ("large", "{published} large")):
        run = data[key]
        first, growth = run["rss_at_first_message_mib"], run["growth_after_first_message_mib"]
        rate = f", {run['msg_s']:,.0f} msg/s" if run["msg_s"] else ""
        lines.append(
            f"| {label.format(**run)} | {run['body_bytes']:,} B "
            f"| {f'{first} MiB' if first is not None else '-'} | {run['peak_rss_mib']} MiB"
            f"{f' (+{growth})' if growth is not None else ''} | {run['budget_mib']} MiB "
            f"| {'yes' if run['within_budget'] else '**no**'} "
            f"| {run['processed']:,} in {run['wall_s']}s{rate} |"
        )
    lines += [
        "",
        f"`manage.py inbox_consume --prefetch {data['prefetch']}`, RSS read from "
        "`/proc/<pid>/status` every 0.2 s (peak: the largest `VmRSS` sample or `VmHWM`; in "
        "brackets its growth after the first message). "
        f"Budget: prefetch x message body + {data['overhead_mib']} MiB.",
        f"The backlog consumer runs {data['backlog']['seconds']} s from its start, then gets "
        "SIGTERM; the large-message one runs until its queue is drained (`--until-idle 2`).",
        "",
    ]
    return "\n".join(lines)
