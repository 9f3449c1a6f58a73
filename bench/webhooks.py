"""Figure 10: signed webhooks over HTTP (``./scripts/bench webhooks``).

Two servers in turn, each with ``bench.settings`` and ``BENCH_URLCONF=bench.webhook_urls``:
uvicorn (ASGI, one process, psycopg's connection pool: ``BENCH_DB_POOL``, as Django advises
under ASGI) and gunicorn (WSGI, 2 processes x 4 threads, persistent connections). Each serves,
in the same run and interleaved:

- ``webhook_view(mode="store")``, sync and async, against the baseline a user would write by
  hand (``bench/webhook_urls.py``): the same Standard Webhooks signature verified, the JSON
  parsed, one ``INSERT … ON CONFLICT DO NOTHING`` in autocommit;
- ``webhook_view(mode="deliver")`` (the benchmark handler's UPDATE runs inline), for
  information, beside ``deliver()`` called in process.

The async views run on uvicorn only (under WSGI Django runs each in an event loop of its
own).

The client: ``BENCH_WEBHOOK_CONNECTIONS`` threads (8), each on one kept-alive connection,
sending requests signed beforehand (so signing is not measured), every message id new.
Requests/s run from the first request sent to the last answer read. Beside each figure: the
server's CPU per request (its processes together) and the machine's busy share; the floor (a
view that reads the body and answers, nothing else) says what the server and Django cost.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from bench.config import DATABASE_URL, ROOT, _env_int, bench_sql, log
from bench.timing import children, machine_busy, payload, server_cpu

REQUESTS = _env_int("BENCH_WEBHOOK_N", 2000)
CONNECTIONS = _env_int("BENCH_WEBHOOK_CONNECTIONS", 8)
#: Runs per variant: more than the other figures' 3, as a run here is short and the client,
#: the server and PostgreSQL share two cores (one run of gunicorn's store / bare read 0.76,
#: two others 0.82 and 0.99).
WEBHOOK_RUNS = _env_int("BENCH_WEBHOOK_RUNS", 5)
TARGET = 0.8
#: Why Django's floor under ASGI is high (py-spy of the async floor, this machine).
UVICORN_FLOOR = (
    " uvicorn alone answers in about 160 µs of CPU; Django's ASGI request cycle runs each "
    "middleware's hooks (`MiddlewareMixin`) and the request's signals through "
    "`sync_to_async`, on a thread made for the request: thread hand-offs, not Python code, "
    "take most of the floor. A project with async-capable middleware only lowers it for "
    "every view alike."
)
#: (name, path) of every variant, timed in this order in every run.
VARIANTS = [
    ("floor", "/floor/"),
    ("async floor", "/async/floor/"),
    ("bare", "/bare/"),
    ("store", "/store/"),
    ("async bare", "/async/bare/"),
    ("async store", "/async/store/"),
    ("deliver", "/deliver/"),
    ("async deliver", "/async/deliver/"),
]


def _request(path: str, message_id: str, sku_index: int) -> bytes:
    """A whole HTTP/1.1 request, signed as a Standard Webhooks sender signs it."""
    from bench.webhook_urls import KEY

    body = json.dumps({"type": "bench.take", **payload(sku_index)}).encode()
    stamp = str(int(time.time()))
    mac = hmac.new(KEY, f"{message_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nwebhook-id: {message_id}\r\n"
        f"webhook-timestamp: {stamp}\r\nwebhook-signature: v1,{base64.b64encode(mac).decode()}"
        "\r\n\r\n"
    )
    return head.encode() + body


def _send(port: int, requests: list[bytes], statuses: list[int]) -> None:
    """Send ``requests`` one after the other on one connection; keep each answer's status."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        reader = sock.makefile("rb")
        for request in requests:
            sock.sendall(request)
            status = int(reader.readline().split()[1])
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            reader.read(length)
            statuses.append(status)


def _timed(port: int, server_pid: int, path: str, prefix: str) -> dict[str, Any]:
    """One timed run of ``REQUESTS`` new messages over ``CONNECTIONS`` connections."""
    per = REQUESTS // CONNECTIONS
    plans = [
        [_request(path, f"{prefix}-{c}-{i}", c * per + i) for i in range(per)]
        for c in range(CONNECTIONS)
    ]
    statuses: list[int] = []
    threads = [threading.Thread(target=_send, args=(port, plan, statuses)) for plan in plans]
    cpu, busy, began = server_cpu(server_pid), machine_busy(), time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    cpu, busy = server_cpu(server_pid) - cpu, machine_busy() - busy
    done = len(statuses)
    wanted = {"store": 202, "bare": 202, "floor": 202}.get(path.strip("/").split("/")[-1], 200)
    if statuses.count(wanted) != per * CONNECTIONS:
        raise RuntimeError(f"{path}: {done} answers, not all {wanted}: {set(statuses)}")
    return {
        "per_s": done / elapsed,
        "server_cpu_us": cpu / done * 1e6,
        "machine_busy": busy / (elapsed * (os.cpu_count() or 1)),
    }


def _in_process_deliver(count: int) -> float:
    """``deliver()`` in this process on ``count`` new messages: the figure beside."""
    from django_inbox import deliver

    began = time.perf_counter()
    for i in range(count):
        deliver(
            consumer="bench",
            message_id=f"inproc-{i}",
            event_type="bench.take",
            payload={"type": "bench.take", **payload(i)},
        )
    return count / (time.perf_counter() - began)


#: The servers, each with the variants it serves: uvicorn (ASGI, one process) and gunicorn
#: (WSGI, 2 processes of 4 threads, the ``gthread`` workers that keep connections alive).
SERVERS = {
    "gunicorn": (
        [
            "gunicorn",
            "testproject.wsgi:application",
            "-w",
            "2",
            "-k",
            "gthread",
            "--threads",
            "4",
            "--log-level",
            "warning",
        ],
        {"BENCH_CONN_MAX_AGE": "none"},
        [v for v in VARIANTS if not v[0].startswith("async")],
    ),
    "uvicorn": (
        ["uvicorn", "testproject.asgi:application", "--no-access-log", "--log-level", "warning"],
        {"BENCH_DB_POOL": "1"},
        VARIANTS,
    ),
}


def _start_server(name: str) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    command, settings, _ = SERVERS[name]
    bind = (
        ["--host", "127.0.0.1", "--port", str(port)]
        if name == "uvicorn"
        else ["-b", f"127.0.0.1:{port}"]
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "DATABASE_URL": DATABASE_URL,
        "BENCH_URLCONF": "bench.webhook_urls",
        **settings,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "testproject")]),
    }
    server = subprocess.Popen([sys.executable, "-m", *command, *bind], env=env, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                time.sleep(0.5)  # gunicorn's workers start after its master listens
                return server, port
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"{name} did not start within 60 s")


def bench_webhooks() -> dict[str, Any]:
    from bench.webhook_urls import CREATE_TABLE

    bench_sql(CREATE_TABLE)
    log(
        f"10. webhooks over HTTP: {REQUESTS} requests x {WEBHOOK_RUNS} runs, "
        f"{CONNECTIONS} connections"
    )
    results: dict[str, Any] = {}
    for name, (_, _, variants) in SERVERS.items():
        server, port = _start_server(name)
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in variants}
        try:
            for label, path in variants:  # warm-up: imports, connections, first requests
                _timed(port, server.pid, path, f"{name}-warm-{label.replace(' ', '-')}")
            for run in range(WEBHOOK_RUNS):
                for label, path in variants:
                    prefix = f"{name}-r{run}-{label.replace(' ', '-')}"
                    found = _timed(port, server.pid, path, prefix)
                    runs[label].append(found)
                    log(f"   {name} run {run + 1} {label:14} {found['per_s']:7.0f} req/s")
                bench_sql(
                    "VACUUM (ANALYZE) django_inbox_inboxmessage, bench_webhook_event, shop_stock"
                )
        finally:
            server.kill()
            for child in children(server.pid):
                os.kill(child, 9)
            server.wait()
        medians = {
            label: {key: statistics.median(r[key] for r in found) for key in found[0]}
            for label, found in runs.items()
        }
        ratios = {"store / bare": medians["store"]["per_s"] / medians["bare"]["per_s"]}
        if "async store" in medians:
            ratios["async store / async bare"] = (
                medians["async store"]["per_s"] / medians["async bare"]["per_s"]
            )
        results[name] = {"medians": medians, "all_runs": runs, "ratios": ratios}
    return {
        "requests": REQUESTS,
        "connections": CONNECTIONS,
        "runs": WEBHOOK_RUNS,
        "servers": results,
        "deliver_in_process_per_s": _in_process_deliver(min(REQUESTS, 2000)),
        "target": TARGET,
    }


def render_webhooks(data: dict[str, Any]) -> str:
    lines = [
        "## 10. Signed webhooks over HTTP",
        "",
        f"{data['connections']} kept-alive connections; {data['requests']} new messages per "
        f"run, median of {data['runs']} interleaved runs; Standard Webhooks signatures, signed "
        "before timing. uvicorn: one process, psycopg's pool (Django's advice under ASGI). "
        "gunicorn: 2 processes x 4 threads (`gthread`), persistent connections.",
        "",
        "| server | view | req/s | server CPU per request | machine busy |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, found in data["servers"].items():
        for label, figure in found["medians"].items():
            lines.append(
                f"| {name} | {label} | {figure['per_s']:,.0f} | "
                f"{figure['server_cpu_us']:,.0f} µs | {figure['machine_busy']:.0%} |"
            )
    lines += [
        f"| in process | `deliver()`, for comparison | {data['deliver_in_process_per_s']:,.0f} "
        "| | |",
        "",
        "| server | ratio | measured | target | |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for name, found in data["servers"].items():
        for label, ratio in found["ratios"].items():
            reached = "reached" if ratio >= data["target"] else "missed"
            lines.append(f"| {name} | {label} | {ratio:.2f} | {data['target']:.2f} | {reached} |")
    lines += ["", "What limits it:", ""]
    for name, found in data["servers"].items():
        medians = found["medians"]
        store, bare, floor = medians["store"], medians["bare"], medians["floor"]
        lines.append(
            f"- {name}: the server's CPU. A view that does nothing costs "
            f"{floor['server_cpu_us']:,.0f} µs per request ({floor['per_s']:,.0f} req/s, the "
            f"ceiling here); the bare view {bare['server_cpu_us']:,.0f} µs, the stored one "
            f"{store['server_cpu_us']:,.0f} µs: the inbox's share is the last difference "
            "(validation, the row's JSON, its transaction). The machine was "
            f"{store['machine_busy']:.0%} busy: client, server and PostgreSQL share its cores."
            + (UVICORN_FLOOR if name == "uvicorn" else "")
        )
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it with ./scripts/bench webhooks")
