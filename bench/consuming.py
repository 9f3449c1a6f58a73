"""Figure 5: broker → consumer → handler → ack, ``inbox_consume`` against a plain kombu consumer."""

from __future__ import annotations

import pstats
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.broker_runs import Queues, broker_reachable, publish, queue_depth, run_consumer
from bench.config import (
    BROKERS,
    CONSUME_N,
    CONSUME_PROFILE_N,
    CONSUME_RUNS,
    loadavg,
    log,
    truncate_inbox,
)
from bench.profiles import summarise
from bench.pyspy import call_counts, callers, cumulative, pyspy_breakdown
from bench.timing import Series


class ConsumeBench:
    """Section 5: broker → consumer → handler → ack, inbox_consume against plain kombu."""

    def __init__(self, queues: Queues) -> None:
        from django_inbox.conf import inbox_settings

        self.queues = queues
        self.prefetch = inbox_settings.prefetch
        self.series: dict[str, Series] = {}
        self.runs: list[dict[str, Any]] = []

    def measure(
        self,
        key: str,
        name: str,
        kind: str,
        url: str,
        count: int,
        *,
        ack: str = "after-process",
        prefetch: int | None = None,
        conn_max_age: str = "none",
        commit_every: int | None = None,
    ) -> dict[str, Any]:
        series = self.series.setdefault(key, Series(name))
        truncate_inbox()
        queue = self.queues.new(url, key)
        published = publish(url, queue, f"{key}-{len(series.rates)}", count)
        info = run_consumer(
            kind,
            url,
            queue,
            ack=ack,
            prefetch=prefetch or self.prefetch,
            conn_max_age=conn_max_age,
            commit_every=commit_every,
        )
        left = queue_depth(url, queue)
        if info["count"] != count or info["completed"] != count or left:
            raise RuntimeError(f"{name}: {info['count']} of {count} handled, {left} left: {info}")
        series.add(
            info["intervals"],
            info["window_s"],
            info["client_cpu_s"],
            info["server_cpu_s"],
            info["machine_busy_s"],
        )
        details = {
            "messages": count,
            "msg_s": round(info["msg_s"], 1),
            "published_msg_s": round(published, 1),
            "startup_s": round(info["startup_s"], 2),
            "process_wall_s": round(info["process_wall_s"], 2),
            "postgresql_connections_opened": info["connections_opened"],
            "broker_cpu_us_per_msg": round(info["broker_cpu_s"] / info["intervals"] * 1e6, 1)
            if info["broker_cpu_s"] is not None
            else None,
            "load_average": loadavg(),
        }
        series.extra.setdefault("runs_detail", []).append(details)
        broker_cpu = [
            d["broker_cpu_us_per_msg"]
            for d in series.extra["runs_detail"]
            if d["broker_cpu_us_per_msg"] is not None
        ]
        if broker_cpu:
            series.extra["broker_cpu_us_per_msg"] = round(statistics.median(broker_cpu), 1)
        series.extra.update(
            kind=kind,
            broker=url.split(":")[0],
            ack=ack,
            prefetch=prefetch or self.prefetch,
            conn_max_age=conn_max_age,
            messages=count,
        )
        log(
            f"   {name:66s} {info['msg_s']:7.0f} msg/s  (start-up {info['startup_s']:.2f}s, "
            f"published at {published:.0f}/s, {info['connections_opened']} PostgreSQL "
            "connection(s))"
        )
        return info

    def profile(self, kind: str, url: str, count: int, how: str, tmp: Path) -> dict[str, Any]:
        """One untimed run of ``kind`` under py-spy (the real process) or cProfile."""
        truncate_inbox()
        queue = self.queues.new(url, f"profile-{kind}")
        publish(url, queue, f"profile-{kind}-{how}", count)
        path = tmp / f"{kind}.{how}"
        info = run_consumer(
            kind,
            url,
            queue,
            prefetch=self.prefetch,
            pyspy=path if how == "py-spy" else None,
            cprofile=path if how == "cprofile" else None,
            max_messages=count,  # no --until-idle wait at the end of the profile
        )
        if how == "py-spy":
            return pyspy_breakdown(path.read_text(), kind, count, 1e6 / info["msg_s"])
        stats = pstats.Stats(str(path))
        found = summarise(stats, count)
        found["calls_per_msg"] = call_counts(stats, count)
        found["cumulative"] = cumulative(stats, count)
        found["json_loads_callers"] = callers(stats, "loads", "json/__init__.py", count)
        found["json_dumps_callers"] = callers(stats, "dumps", "json/__init__.py", count)
        return found


def bench_consume() -> tuple[dict[str, Series], dict[str, Any]]:
    """RabbitMQ (and Redis) → consumer → the bench handler → ack, in one consumer process."""
    n, half, small = CONSUME_N, max(1000, CONSUME_N // 2), max(500, CONSUME_N // 10)
    log(
        f"\n== 5. broker consumers: {CONSUME_RUNS} interleaved runs x {n} messages, "
        f"inbox_consume against a plain kombu consumer"
    )
    down = {name: broker_reachable(url) for name, url in BROKERS.items()}
    for name, why in down.items():
        if why:
            log(f"   {name} at {BROKERS[name]} is not reachable ({why}): skipped")
    queues = Queues()
    bench = ConsumeBench(queues)
    extra: dict[str, Any] = {"skipped": {k: v for k, v in down.items() if v}}
    rabbit, redis = BROKERS["rabbitmq"], BROKERS["redis"]
    try:
        if not down["rabbitmq"]:
            pair = [
                ("consume_rabbitmq", "RabbitMQ → manage.py inbox_consume, ack after process"),
                ("consume_rabbitmq_plain", "RabbitMQ → plain kombu consumer, same handler"),
                (
                    "consume_rabbitmq_batched",
                    "RabbitMQ → inbox_consume --commit-every 100 (batched commits)",
                ),
            ]
            for run in range(CONSUME_RUNS):
                # interleaved, the order alternating, so a trend in the machine's load
                # favours none
                for key, name in pair if run % 2 == 0 else pair[::-1]:
                    kind = "plain" if key.endswith("plain") else "inbox"
                    batched = 100 if key.endswith("batched") else None
                    bench.measure(key, name, kind, rabbit, n, commit_every=batched)
            bench.measure(
                "consume_rabbitmq_store",
                f"RabbitMQ → inbox_consume --ack after-store, {half} msgs (info)",
                "inbox",
                rabbit,
                half,
                ack="after-store",
            )
            bench.measure(
                "consume_rabbitmq_prefetch1",
                f"RabbitMQ → inbox_consume, prefetch 1, {half} msgs (info)",
                "inbox",
                rabbit,
                half,
                prefetch=1,
            )
            bench.measure(
                "consume_rabbitmq_plain_prefetch1",
                f"RabbitMQ → plain kombu, prefetch 1, {half} msgs (info)",
                "plain",
                rabbit,
                half,
                prefetch=1,
            )
            bench.measure(
                "consume_rabbitmq_age0",
                f"RabbitMQ → inbox_consume, CONN_MAX_AGE=0, {small} msgs (info)",
                "inbox",
                rabbit,
                small,
                conn_max_age="0",
            )
            bench.measure(
                "consume_rabbitmq_plain_age0",
                f"RabbitMQ → plain kombu, CONN_MAX_AGE=0, {small} msgs (info)",
                "plain",
                rabbit,
                small,
                conn_max_age="0",
            )
        if not down["redis"]:
            pair = [
                ("consume_redis", f"Redis → inbox_consume, ack after process, {half} msgs (info)"),
                ("consume_redis_plain", f"Redis → plain kombu consumer, {half} msgs (info)"),
            ]
            for run in range(min(2, CONSUME_RUNS)):
                for key, name in pair if run % 2 == 0 else pair[::-1]:
                    kind = "plain" if key.endswith("plain") else "inbox"
                    bench.measure(key, name, kind, redis, half)
        if not down["rabbitmq"]:
            extra["profiles"] = consume_profiles(bench, rabbit)
    finally:
        queues.delete_all()
        truncate_inbox()
    extra["prefetch_default"] = bench.prefetch
    return bench.series, extra


def consume_profiles(bench: ConsumeBench, url: str) -> dict[str, Any]:
    count = CONSUME_PROFILE_N
    log(
        f"   profiling (untimed): py-spy on inbox_consume and the plain consumer, twice each, "
        f"{count} messages a run, then cProfile of both"
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if (Path(sys.executable).parent / "py-spy").exists():
            # twice each (inbox, plain, plain, inbox): the machine is shared, so keep each
            # consumer's least disturbed run, the one with the lowest wall time per message
            for kind in ("inbox", "plain", "plain", "inbox"):
                found = bench.profile(kind, url, count, "py-spy", Path(tmp))
                key = f"{kind}_py-spy"
                walls = [
                    *out.get(key, {}).get("runs_wall_us_per_msg", []),
                    found["wall_us_per_msg"],
                ]
                if key not in out or found["wall_us_per_msg"] < out[key]["wall_us_per_msg"]:
                    out[key] = found
                out[key]["runs_wall_us_per_msg"] = walls
                top = ", ".join(
                    f"{label} {step['share']:.0%}"
                    for label, step in list(found["steps"].items())[:5]
                )
                log(
                    f"   py-spy {kind:6s} {found['wall_us_per_msg']:5.0f} µs/msg, "
                    f"{found['samples']} samples: {top}"
                )
        else:
            log("   py-spy is not installed in .venv: skipped (pip install py-spy)")
        for kind in ("inbox", "plain"):
            found = bench.profile(kind, url, count, "cprofile", Path(tmp))
            out[f"{kind}_cprofile"] = found
            log(
                f"   cProfile {kind:6s} {found['profiled_us_per_msg']:.0f} µs/msg profiled; per "
                f"message: {found['calls_per_msg']}"
            )
    return out


# What a consumer does per message, from py-spy's stacks: the step a sample belongs to is the
# first of these frames found under the per-message callback (root to leaf). (function name
# ends with, file contains, label).
