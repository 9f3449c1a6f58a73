"""Figure 14: one, two and three hosts (``./scripts/bench hosts``).

Three test hosts (network namespaces of this machine, ``scripts/hosts``) run the inbox's
commands against a PostgreSQL cluster and a RabbitMQ node of the bench's own, which listen on
loopback and on the hosts' links. Two workloads, each with 1, 2 and 3 hosts (one process per
host) and, for comparison, 3 processes on this machine's loopback (no namespace, no veth):

- **drain**: ``inbox_process`` over ``BENCH_HOSTS_N`` stored rows (20,000) of the testproject's
  ``effects`` consumer (its handler inserts one row);
- **consume**: ``inbox_consume --ack after-process`` over the same number of ids published
  to a queue with about 30% of them sent more than once (the same handler).

Rows/s are measured on the database between 10% and 90% of the rows completed, so the
commands' start and end are left out. The CPU each part used over that window, and how busy
the machine was, say where the limit is: on a 2-core machine, the cores.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import median
from typing import Any

from bench.config import _env_int, log
from bench.timing import children, machine_busy, proc_cpu

N = _env_int("BENCH_HOSTS_N", 20_000)
RUNS = _env_int("BENCH_HOSTS_RUNS", 3)
#: (label, hosts, processes): one process per host; the last runs on loopback.
SETUPS = [("1 host", 1, 1), ("2 hosts", 2, 2), ("3 hosts", 3, 3), ("3 on loopback", 0, 3)]
INBOX = "django_inbox_inboxmessage"


def _sql(cluster: Any, sql: str) -> list[tuple[Any, ...]]:
    with cluster.connect(autocommit=True) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchall() if cursor.description else []


def _load(cluster: Any, n: int) -> None:
    """``n`` rows of the ``effects`` consumer, due now."""
    _sql(
        cluster,
        f"INSERT INTO {INBOX} (consumer, message_id, source, event_type, key, payload, headers, "
        "status, attempts, last_error, history, received_at, updated_at, next_attempt_at, "
        "locked_until, lease_id, processed_at) "
        "SELECT 'effects', 'h-' || i, '', 'effect.write', '', '{}', '{}', 'received', 0, '', "
        "'[]', now(), now(), now(), NULL, '', NULL "
        f"FROM generate_series(1, {n}) AS i",
    )


def _postgres_cpu(cluster: Any) -> float:
    (pid,) = (cluster.data / "postmaster.pid").read_text().split()[:1]
    return proc_cpu(int(pid)) + sum(proc_cpu(child) for child in children(int(pid)))


def _rabbit_cpu(node: Any) -> float:
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"RABBITMQ_NODENAME={node.name}".encode() in (proc / "environ").read_bytes():
                total += proc_cpu(int(proc.name))
        except OSError:
            continue
    return total


def _run(
    cluster: Any,
    node: Any,
    hosts: list[Any],
    workload: str,
    setup: tuple[str, int, int],
    queue: str,
) -> dict[str, Any]:
    from tests import brokers
    from tests.clusters import manage_on

    _label, count, processes = setup
    _sql(cluster, f"TRUNCATE {INBOX}, effects_effect")
    if workload == "drain":
        _load(cluster, N)
        expected = N
    else:
        messages, unique = brokers.stream(N, seed=len(queue))
        brokers.publish(node.url, queue, messages)
        expected = len(unique)
    procs = []
    for k in range(processes):
        host = hosts[k] if count else None
        address = host.services if host else "127.0.0.1"
        url = cluster.url_at(address)
        prefix = host.prefix if host else ()
        if workload == "drain":
            args: tuple[str, ...] = ("inbox_process", "--consumer", "effects")
        else:
            args = ("inbox_consume", "--consumer", "effects", "--queue", queue, "--no-declare",
                    "--broker", node.url_at(address))  # fmt: skip
        procs.append(manage_on(url, *args, "--until-idle", "2", prefix=prefix))
    try:
        marks = _marks(cluster, node, procs, workload, expected)
    finally:  # measured (or failed): the commands stop, gracefully
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
    for proc in procs:
        _out, err = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"{args[0]} exited {proc.returncode}: {err[-2000:]}")
    if len(marks) < 2:
        raise RuntimeError(f"{workload}: 90% of {expected:,} rows not completed in 10 minutes")
    (t0, busy0, pg0, mq0, py0), (t1, busy1, pg1, mq1, py1) = marks["start"], marks["end"]
    wall = t1 - t0
    rows = 0.8 * expected
    return {
        "rows_per_s": rows / wall,
        "machine_busy": (busy1 - busy0) / wall,
        "postgres_cores": (pg1 - pg0) / wall,
        "rabbitmq_cores": (mq1 - mq0) / wall,
        "commands_cores": (py1 - py0) / wall,
        "commands_cpu_us_per_row": (py1 - py0) / rows * 1e6,
        "postgres_cpu_us_per_row": (pg1 - pg0) / rows * 1e6,
    }


def _marks(
    cluster: Any, node: Any, procs: list[Any], workload: str, expected: int
) -> dict[str, tuple[float, float, float, float, float]]:
    """The time and CPU counters when 10% and 90% of ``expected`` rows were completed."""
    marks: dict[str, tuple[float, float, float, float, float]] = {}
    deadline = time.monotonic() + 600
    while len(marks) < 2 and time.monotonic() < deadline:
        (done,) = _sql(cluster, f"SELECT count(*) FROM {INBOX} WHERE status = 'completed'")[0]
        for name, share in (("start", 0.1), ("end", 0.9)):
            if name not in marks and done >= share * expected:
                marks[name] = (
                    time.monotonic(),
                    machine_busy(),
                    _postgres_cpu(cluster),
                    _rabbit_cpu(node) if workload == "consume" else 0.0,
                    sum(proc_cpu(proc.pid) for proc in procs),
                )
        time.sleep(0.05)
    return marks


def bench_hosts() -> dict[str, Any]:
    from tests import brokers
    from tests.clusters import command_on, private_cluster
    from tests.hosts import made_hosts, unavailable

    log(f"\n== hosts: drain and consume of {N:,} rows on 1, 2 and 3 hosts, {RUNS} runs each")
    why = unavailable()
    if why:
        return {"skipped": f"no network namespaces on this machine: {why}"}
    with made_hosts(3) as hosts:
        addresses = [host.services for host in hosts]
        trusted = [f"{address}/30" for address in addresses]
        with (
            private_cluster(listen=addresses, trusted=trusted, settings=["max_connections=40"])
            as cluster,
            brokers.private_rabbitmq(listen=addresses) as node,
        ):  # fmt: skip
            migrate = command_on(cluster, "migrate", "--verbosity", "0")
            if migrate.wait(timeout=300) != 0:
                raise RuntimeError(f"migrate failed: {migrate.stderr.read()[-2000:]}")  # type: ignore[union-attr]
            queue = "bench-hosts"
            with brokers.connect(node.url) as connection:
                from kombu import Queue

                Queue(queue, routing_key=queue, durable=True)(connection.default_channel).declare()
            results: dict[str, dict[str, list[dict[str, Any]]]] = {}
            for workload in ("drain", "consume"):
                results[workload] = {label: [] for label, _, _ in SETUPS}
                for run in range(RUNS):
                    order = SETUPS if run % 2 == 0 else list(reversed(SETUPS))
                    for setup in order:
                        measured = _run(cluster, node, hosts, workload, setup, queue)
                        results[workload][setup[0]].append(measured)
                        log(
                            f"   {workload:7} {setup[0]:13} run {run + 1}: "
                            f"{measured['rows_per_s']:8,.0f} rows/s, machine "
                            f"{measured['machine_busy']:.2f} cores busy (PostgreSQL "
                            f"{measured['postgres_cores']:.2f}, RabbitMQ "
                            f"{measured['rabbitmq_cores']:.2f}, commands "
                            f"{measured['commands_cores']:.2f})"
                        )
    summary: dict[str, Any] = {"n": N, "runs": RUNS, "workloads": {}}
    for workload, by_setup in results.items():
        rows = {}
        for label, measured in by_setup.items():
            rows[label] = {
                key: round(median(m[key] for m in measured), 2) for key in measured[0]
            } | {"runs": [round(m["rows_per_s"]) for m in measured]}
        one = rows["1 host"]["rows_per_s"]
        for row in rows.values():
            row["ratio_to_1_host"] = round(row["rows_per_s"] / one, 2)
        summary["workloads"][workload] = rows
    return summary


def render_hosts(data: dict[str, Any]) -> str:
    if "skipped" in data:
        return f"## Figure 14: one, two and three hosts\n\nNot measured: {data['skipped']}.\n"
    lines = [
        "## Figure 14: one, two and three hosts",
        "",
        f"{data['n']:,} rows per run, {data['runs']} runs (median). One process per host; "
        "cores are CPU-seconds per second over the measured window (this machine has 2).",
        "",
        "| workload | hosts | rows/s | / 1 host | machine busy | PostgreSQL | RabbitMQ | "
        "commands | commands µs/row | PostgreSQL µs/row |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload, rows in data["workloads"].items():
        for label, row in rows.items():
            lines.append(
                f"| {workload} | {label} | {row['rows_per_s']:,.0f} ({row['runs']}) | "
                f"{row['ratio_to_1_host']:.2f} | {row['machine_busy']:.2f} | "
                f"{row['postgres_cores']:.2f} | {row['rabbitmq_cores']:.2f} | "
                f"{row['commands_cores']:.2f} | {row['commands_cpu_us_per_row']:,.0f} | "
                f"{row['postgres_cpu_us_per_row']:,.0f} |"
            )
    lines.append("")
    return "\n".join(lines)
