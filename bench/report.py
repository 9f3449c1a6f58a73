"""Turn one benchmark run into ``bench/results/latest.json`` and ``latest.md``.

The "what limits it" lines are written from the numbers of the same run: wall time per
message split into client CPU, PostgreSQL backend CPU and the rest (round-trip latency,
commit flush, waiting for a core), round trips counted on the wire, and cProfile's view of
the client's Python time.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

ORDER = [
    ("1", "deliver"),
    ("1a", "bare_django"),
    ("1b", "raw_psycopg"),
    ("1c", "pgbench_update"),
    ("", "raw_psycopg_inbox"),
    ("", "pgbench_inbox"),
    ("", "pgbench_inbox_simple"),
    ("", "deliver_prepared"),
    ("", "bare_prepared"),
    ("", "deliver_noop"),
    ("", "pgbench_N"),
    ("", "pgbench_S"),
    ("2", "drain_in_process"),
    ("2", "drain_subprocess"),
    ("2", "drain_subprocess_net"),
    ("", "drain_2_subprocesses"),
    ("", "drain_small"),
    ("", "drain_persistent"),
    ("", "drain_tuned"),
    ("", "drain_noop"),
    ("", "drain_commit_every"),
    ("2", "store_batched"),
    ("3", "duplicate_deliver"),
    ("", "duplicate_store"),
    ("4", "store_single"),
    ("5", "consume_rabbitmq"),
    ("5a", "consume_rabbitmq_plain"),
    ("5b", "consume_rabbitmq_batched"),
    ("", "consume_rabbitmq_store"),
    ("", "consume_rabbitmq_prefetch1"),
    ("", "consume_rabbitmq_plain_prefetch1"),
    ("", "consume_rabbitmq_age0"),
    ("", "consume_rabbitmq_plain_age0"),
    ("", "consume_redis"),
    ("", "consume_redis_plain"),
]

# py-spy steps of a consumed message that the analysis names, and a short name for each.
STEP_NAMES = {
    "insert": "deliver: inbox INSERT (insert_row)",
    "materialise": "deliver: build InboxMessage (_materialise)",
    "prepare": "deliver: _prepare (validate, JSON-encode)",
    "envelope": "envelope: read properties, decode body and headers",
    "commit": "atomic() exit: COMMIT",
    "handler": "handler: ORM UPDATE (take_one)",
    "broker": "broker: read frames, build the kombu message",
    "ack": "message.ack()",
    "sweep": "loop: _between_messages (sweep for due retries once a second)",
    "close": "close_old_connections()",
}


def _f(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _us(rate: float) -> float:
    return 1e6 / rate if rate else 0.0


def _verdict(ok: bool) -> str:
    return "reached" if ok else "missed"


class Report:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.fig: dict[str, dict[str, Any]] = data["figures"]
        self.rt: dict[str, dict[str, Any]] = data["round_trips"]
        self.prof: dict[str, dict[str, Any]] = data["profiles"]
        self.targets: dict[str, float] = data["targets"]
        self.consume: dict[str, Any] = data.get("consume") or {}

    def median(self, key: str) -> float:
        return float(self.fig.get(key, {}).get("median", 0.0))

    def ratio(self, top: str, bottom: str) -> float | None:
        a, b = self.median(top), self.median(bottom)
        return a / b if a and b else None

    def paired(self, top: str, bottom: str) -> list[float]:
        """Per-run ratios of two series measured in the same interleaved rounds."""
        a = self.fig.get(top, {}).get("runs", [])
        b = self.fig.get(bottom, {}).get("runs", [])
        if len(a) != len(b) or len(a) < 2:
            return []
        return [x / y for x, y in zip(a, b, strict=True) if y]

    def split(self, key: str) -> tuple[float, float, float]:
        """(wall, client CPU, server CPU) in µs per message; 0 where not measured."""
        f = self.fig.get(key, {})
        return (
            _us(f.get("median", 0.0)),
            float(f.get("client_cpu_us_per_msg") or 0.0),
            float(f.get("server_cpu_us_per_msg") or 0.0),
        )

    # --------------------------------------------------------------------- tables

    def targets_table(self) -> list[str]:
        ratio = self.ratio("deliver", "bare_django") or 0.0
        drain = self.median("drain_in_process")
        sub = self.median("drain_subprocess")
        dup = self.median("duplicate_deliver")
        t = self.targets
        return [
            "| target | measured | goal | result |",
            "| --- | ---: | ---: | --- |",
            f"| 1. deliver() / same handler in bare `atomic()` | {ratio:.2f} | "
            f"≥ {t['deliver_vs_bare']:.2f} | **{_verdict(ratio >= t['deliver_vs_bare'])}** |",
            f"| 2. drain, one worker process (Worker.run() in process) | {_f(drain)} msg/s | "
            f"≥ {_f(t['drain'])} msg/s | **{_verdict(drain >= t['drain'])}** |",
            f"| 2. drain, one `manage.py inbox_process` (wall clock) | {_f(sub)} msg/s | "
            f"≥ {_f(t['drain'])} msg/s | **{_verdict(sub >= t['drain'])}** |",
            f"| 3. duplicate rejection, deliver() of completed ids | {_f(dup)} msg/s | "
            f"≥ {_f(t['duplicates'])} msg/s | **{_verdict(dup >= t['duplicates'])}** |",
            *self.consume_targets(),
        ]

    def consume_targets(self) -> list[str]:
        t = self.targets
        if "consume_vs_plain" not in t:
            return []
        if not self.median("consume_rabbitmq"):
            why = self.consume.get("skipped", {}).get("rabbitmq", "not run")
            return [f"| 5. RabbitMQ → inbox_consume | not measured ({why}) | | |"]
        ratio, how = self.consume_ratio()
        rate = self.median("consume_rabbitmq")
        return [
            f"| 5. RabbitMQ → inbox_consume → handler → ack / plain kombu consumer, same "
            f"handler ({how}) | {ratio:.2f} | ≥ {t['consume_vs_plain']:.2f} | "
            f"**{_verdict(ratio >= t['consume_vs_plain'])}** |",
            f"| 5. inbox_consume, one process (first to last message) | {_f(rate)} msg/s | "
            f"≥ {_f(t['consume'])} msg/s | **{_verdict(rate >= t['consume'])}** |",
            *self.batched_consume_targets(),
        ]

    def batched_consume_targets(self) -> list[str]:
        """The same targets with batched commits (``--commit-every 100``), same runs."""
        t = self.targets
        rate = self.median("consume_rabbitmq_batched")
        ratio = self.ratio("consume_rabbitmq_batched", "consume_rabbitmq_plain")
        if not rate or ratio is None:
            return []
        return [
            f"| 5b. inbox_consume --commit-every 100 / plain kombu consumer (ratio of "
            f"medians) | {ratio:.2f} | ≥ {t['consume_vs_plain']:.2f} | "
            f"**{_verdict(ratio >= t['consume_vs_plain'])}** |",
            f"| 5b. inbox_consume --commit-every 100, one process | {_f(rate)} msg/s | "
            f"≥ {_f(t['consume'])} msg/s | **{_verdict(rate >= t['consume'])}** |",
        ]

    def figures_table(self) -> list[str]:
        rows = [
            "| # | figure | median | unit | runs | µs/msg | client CPU µs/msg "
            "| server CPU µs/msg | machine busy, cores |",
            "| --- | --- | ---: | --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for num, key in ORDER:
            f = self.fig.get(key)
            if not f:
                continue
            runs = ", ".join(_f(r) for r in f["runs"])
            busy = f.get("machine_busy_cores")
            rows.append(
                f"| {num} | {f['name']} | {_f(f['median'])} | {f['unit']} | {runs} | "
                f"{_f(_us(f['median']))} | {_f(f.get('client_cpu_us_per_msg'))} | "
                f"{_f(f.get('server_cpu_us_per_msg'))} | "
                f"{_f(statistics.median(busy), 2) if busy else '-'} |"
            )
        return rows

    def ratios_table(self) -> list[str]:
        rows = ["| ratio | of medians | per interleaved run |", "| --- | ---: | --- |"]
        for label, top, bottom in (
            ("deliver() / bare Django (target ≥ 0.85)", "deliver", "bare_django"),
            ("deliver() / raw psycopg, same UPDATE", "deliver", "raw_psycopg"),
            ("deliver() / pgbench, same UPDATE", "deliver", "pgbench_update"),
            ("deliver() / raw psycopg running deliver()'s SQL", "deliver", "raw_psycopg_inbox"),
            ("deliver() / pgbench running deliver()'s SQL, prepared", "deliver", "pgbench_inbox"),
            (
                "pgbench, deliver()'s SQL: simple protocol / prepared",
                "pgbench_inbox_simple",
                "pgbench_inbox",
            ),
            (
                "bare Django / raw psycopg (what Django's ORM and atomic() cost)",
                "bare_django",
                "raw_psycopg",
            ),
            ("raw psycopg: deliver()'s SQL / the UPDATE alone", "raw_psycopg_inbox", "raw_psycopg"),
            ("with prepared statements: deliver() / bare", "deliver_prepared", "bare_prepared"),
            ("deliver() with / without prepared statements", "deliver_prepared", "deliver"),
            ("deliver() / deliver() to an empty handler", "deliver", "deliver_noop"),
            ("drain in process / deliver()", "drain_in_process", "deliver"),
            ("drain: persistent connection / as configured", "drain_persistent", "drain_small"),
            ("drain: persistent + prepared / as configured", "drain_tuned", "drain_small"),
            ("drain: empty handler / as configured", "drain_noop", "drain_small"),
            ("drain: commit_every=100 / as configured", "drain_commit_every", "drain_small"),
            ("2 inbox_process / 1 inbox_process", "drain_2_subprocesses", "drain_subprocess"),
            (
                "RabbitMQ: inbox_consume / plain kombu (target ≥ 0.8)",
                "consume_rabbitmq",
                "consume_rabbitmq_plain",
            ),
            (
                "RabbitMQ: inbox_consume --commit-every 100 / plain kombu (target ≥ 0.8)",
                "consume_rabbitmq_batched",
                "consume_rabbitmq_plain",
            ),
            (
                "RabbitMQ: inbox_consume --ack after-store / plain kombu",
                "consume_rabbitmq_store",
                "consume_rabbitmq_plain",
            ),
            (
                "RabbitMQ, prefetch 1: inbox_consume / plain kombu",
                "consume_rabbitmq_prefetch1",
                "consume_rabbitmq_plain_prefetch1",
            ),
            (
                "inbox_consume: prefetch 1 / default",
                "consume_rabbitmq_prefetch1",
                "consume_rabbitmq",
            ),
            (
                "plain kombu: prefetch 1 / default",
                "consume_rabbitmq_plain_prefetch1",
                "consume_rabbitmq_plain",
            ),
            (
                "CONN_MAX_AGE=0: inbox_consume / plain kombu",
                "consume_rabbitmq_age0",
                "consume_rabbitmq_plain_age0",
            ),
            ("inbox_consume: CONN_MAX_AGE=0 / None", "consume_rabbitmq_age0", "consume_rabbitmq"),
            (
                "plain kombu: CONN_MAX_AGE=0 / None",
                "consume_rabbitmq_plain_age0",
                "consume_rabbitmq_plain",
            ),
            ("Redis: inbox_consume / plain kombu", "consume_redis", "consume_redis_plain"),
            ("inbox_consume: Redis / RabbitMQ", "consume_redis", "consume_rabbitmq"),
        ):
            value = self.ratio(top, bottom)
            if value is not None:
                runs = ", ".join(f"{r:.2f}" for r in self.paired(top, bottom)) or "-"
                rows.append(f"| {label} | {value:.2f} | {runs} |")
        return rows

    def time_table(self) -> list[str]:
        rows = [
            "| figure | wall µs/msg | client CPU | PostgreSQL backend CPU | rest |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for _, key in ORDER:
            f = self.fig.get(key)
            if not f or f["unit"] != "msg/s" or not f.get("server_cpu_us_per_msg"):
                continue
            wall, client, server = self.split(key)
            rows.append(
                f"| {f['name']} | {_f(wall)} | {_f(client)} | {_f(server)} | "
                f"{_f(max(0.0, wall - client - server))} |"
            )
        return rows

    def round_trip_table(self) -> list[str]:
        rows = [
            "| operation | round trips / msg | statements of one message |",
            "| --- | ---: | --- |",
        ]
        for key, found in self.rt.items():
            statements = ", ".join(f"`{s}`" for s in found["statements"])
            if key == "drain":
                claim = ", ".join(f"`{s}`" for s in found["claim_statements_per_batch_of_100"])
                statements += (
                    f"; per batch of 100: {claim} ({found['round_trips_per_batch_of_100']} "
                    "round trips for the batch) and, with CONN_MAX_AGE=0, a new connection"
                )
            rows.append(f"| {key} | {found['round_trips_per_message']:.2f} | {statements} |")
        return rows

    def profile_section(self) -> list[str]:
        lines = []
        names = {
            "inbox_cprofile": "consume: inbox_consume (subprocess, call_command)",
            "plain_cprofile": "consume: plain kombu (subprocess)",
        }
        consume = {
            names[key]: found
            for key, found in self.consume.get("profiles", {}).items()
            if key in names
        }
        for key, found in {**self.prof, **consume}.items():
            groups = ", ".join(
                f"{g} {share:.0%}"
                for g, share in found["python_share_by_group"].items()
                if share >= 0.02
            )
            broker = found.get("broker_waiting_share")
            waiting = f", reading the broker's socket {broker:.0%}" if broker else ""
            lines.append(
                f"- **{key}** ({found['messages']} messages, {found['profiled_us_per_msg']:.0f} "
                f"µs/msg under the profiler): waiting for PostgreSQL "
                f"{found['waiting_share']:.0%} of profiled time{waiting}. Python time: {groups}."
            )
            top = "; ".join(
                f"`{t['where']}` {t['share']:.0%} ({t['calls_per_msg']:g}/msg)"
                for t in found["top_python_functions"][:6]
            )
            lines.append(f"  Top Python functions: {top}.")
            calls = found.get("calls_per_msg")
            if calls:
                counted = "; ".join(f"{label} {n:g}" for label, n in calls.items())
                lines.append(f"  Calls per message: {counted}.")
            cumulative = found.get("cumulative")
            if cumulative:
                each = "; ".join(
                    f"`{where}` {c['cumulative_us_per_msg']:.0f} µs ({c['calls_per_msg']:g}/msg)"
                    for where, c in sorted(
                        cumulative.items(), key=lambda kv: -kv[1]["cumulative_us_per_msg"]
                    )
                )
                lines.append(f"  Cumulative time per message under cProfile: {each}.")
        return lines

    def pyspy_section(self) -> list[str]:
        lines = []
        for key, found in self.consume.get("profiles", {}).items():
            if not key.endswith("py-spy") or not found.get("samples"):
                continue
            name = "manage.py inbox_consume" if key.startswith("inbox") else "plain kombu"
            waiting = ", ".join(f"{k} {v:.0%}" for k, v in found["waiting_share"].items())
            top = "; ".join(
                f"`{t['where']}` {t['share']:.1%}" for t in found["top_leaf_functions_not_waiting"]
            )
            lines.append(
                f"- **{name}** ({found['messages']} messages, {found['samples']} samples at "
                f"{found['wall_us_per_msg']:.0f} µs/msg under py-spy): waiting for {waiting} "
                f"of wall time. Innermost Python frames of the other samples: {top}."
            )
        return lines

    # --------------------------------------------------------------------- analysis

    def limit_deliver(self) -> str:
        d_wall, d_client, d_server = self.split("deliver")
        b_wall, b_client, b_server = self.split("bare_django")
        r_wall, _, _ = self.split("raw_psycopg")
        ri_wall, _, _ = self.split("raw_psycopg_inbox")
        dp_wall, _, dp_server = self.split("deliver_prepared")
        bp_wall, _, _ = self.split("bare_prepared")
        rt_d = self.rt.get("deliver", {}).get("round_trips_per_message", 0)
        rt_b = self.rt.get("bare_django", {}).get("round_trips_per_message", 0)
        ratio = self.ratio("deliver", "bare_django") or 0.0
        floor = ri_wall - r_wall  # the extra INSERT and its round trip, without Python
        best = b_wall / (b_wall + floor) if b_wall + floor > 0 else 0.0
        # handler cost at which the present overhead would meet the target
        goal = self.targets["deliver_vs_bare"]
        needed = goal / (1 - goal) * (d_wall - b_wall)
        paired = ", ".join(f"{r:.2f}" for r in self.paired("deliver", "bare_django"))
        n_wall, n_client, n_server = self.split("deliver_noop")
        pg_prep, pg_simple = self.median("pgbench_inbox"), self.median("pgbench_inbox_simple")
        parse = _us(pg_simple) - _us(pg_prep) if pg_prep and pg_simple else None
        return (
            f"- **1. deliver() / bare = {ratio:.2f}, {_verdict(ratio >= goal)}** (per "
            f"interleaved run: {paired or '-'}). deliver() "
            f"takes {_f(d_wall)} µs/msg, the bare handler {_f(b_wall)} µs: +{_f(d_wall - b_wall)}"
            f" µs, of which client CPU +{_f(d_client - b_client)} µs and PostgreSQL CPU "
            f"+{_f(d_server - b_server)} µs. Round trips: {rt_d:g} against {rt_b:g} (the extra "
            "one is the inbox's own INSERT … ON CONFLICT DO NOTHING RETURNING id). Server side, "
            "Django sends every statement as text with inlined values (client-side binding, no "
            "prepared statements by default), so PostgreSQL parses and plans deliver()'s "
            "statements for every message: pgbench replaying deliver()'s exact statements runs "
            f"{_f(pg_simple)} tps as text and {_f(pg_prep)} tps prepared, so parse and plan cost "
            f"{_f(parse)} µs per message; with Django's prepared statements deliver()'s server "
            f"CPU drops from {_f(d_server)} to {_f(dp_server)} µs/msg and deliver() takes "
            f"{_f(dp_wall)} µs (bare: {_f(bp_wall)} µs). Client side the extra is the inbox's "
            "Python: "
            "argument validation and JSON encoding (`_prepare`), building the `InboxMessage` "
            "(`_materialise`: model `__init__` and `json.loads` of the payload and headers just "
            "encoded), binding the parameters in psycopg's client cursor, Django's cursor wrapper "
            "and one more send/receive. deliver() to an empty handler, i.e. the inbox alone "
            f"(BEGIN, INSERT, COMMIT), takes {_f(n_wall)} µs/msg ({_f(n_client)} client CPU, "
            f"{_f(n_server)} PostgreSQL CPU). The floor: raw psycopg needs "
            f"{_f(floor)} µs for the extra INSERT and round trip, so even a zero-overhead "
            f"inbox would reach {best:.2f} against this {_f(b_wall)} µs handler; with the "
            f"present overhead the ratio reaches {goal:.2f} for handlers of ≥ {_f(needed)} µs."
        )

    def limit_drain(self) -> str:
        dr_wall, dr_client, _ = self.split("drain_in_process")
        b_wall, _, _ = self.split("bare_django")
        small, persistent, tuned = (
            self.median("drain_small"),
            self.median("drain_persistent"),
            self.median("drain_tuned"),
        )
        p_wall, p_client, p_server = self.split("drain_persistent")
        n_wall, n_client, _ = self.split("drain_noop")
        rt = self.rt.get("drain", {})
        drain = self.median("drain_in_process")
        details = self.fig.get("drain_in_process", {}).get("runs_detail", [{}])
        first = details[0] if details else {}
        goal = self.targets["drain"]
        two = self.fig.get("drain_2_subprocesses", {})
        two_busy = two.get("machine_busy_cores", [None])[0]
        one = self.fig.get("drain_subprocess", {})
        return (
            f"- **2. drain = {_f(drain)} msg/s in process, {_verdict(drain >= goal)}** (goal "
            f"{_f(goal)} msg/s = {_f(_us(goal))} µs/msg; measured {_f(dr_wall)} µs/msg, "
            f"{_f(dr_client)} µs of it client CPU). Per message: "
            f"{rt.get('round_trips_per_message', 0):g} round trips (BEGIN, the handler's UPDATE, "
            "the fenced `complete_row` UPDATE, COMMIT; the claim adds 5 per batch of 100) and "
            "one commit. The handler alone is the bare baseline, "
            f"{_f(b_wall)} µs/msg, already over the {_f(_us(goal))} µs budget: one Python "
            "process running an ORM handler cannot drain 5,000 msg/s on this machine. On top, "
            f"`Worker.run()` opened {first.get('connections_opened')} connections for "
            f"{_f(first.get('messages'))} messages: it calls `close_old_connections()` on every "
            "loop and with CONN_MAX_AGE=0 (Django's default, the test project's) that closes the "
            f"connection after each batch. Django connects in {rt.get('connect_ms')} ms and a "
            f"batch of 100 takes {rt.get('batch_of_100_on_new_connection_ms')} ms on a new "
            f"backend against {rt.get('batch_of_100_on_warm_connection_ms')} ms on a warm one. "
            f"Same-size drains, interleaved: {_f(small)} msg/s as configured, {_f(persistent)} "
            f"with CONN_MAX_AGE=None ({_f(p_wall)} µs/msg: {_f(p_client)} client CPU, "
            f"{_f(p_server)} PostgreSQL CPU), {_f(tuned)} with prepared statements as well. "
            f"With an empty handler the worker drains {_f(self.median('drain_noop'))} msg/s "
            f"({_f(n_wall)} µs/msg, {_f(n_client)} µs client CPU): that is the inbox machinery "
            f"alone (claim, BEGIN, fenced completion UPDATE, COMMIT, reconnects), "
            f"{'within' if n_wall <= _us(goal) else 'already over'} the budget. "
            f"Processes: one inbox_process drained {_f(self.median('drain_subprocess'))} msg/s "
            f"using {_f(one.get('client_cpu_us_per_msg'))} µs CPU/msg, two at once "
            f"{_f(self.median('drain_2_subprocesses'))} msg/s using "
            f"{_f(two.get('client_cpu_us_per_msg'))} µs CPU/msg with the machine "
            f"{_f(two_busy, 2)} of {self.data['facts']['nproc']} cores busy: one worker and its "
            "backend already keep about one core busy, so a second worker on 2 shared cores "
            "gains little here; SKIP LOCKED lets workers scale where there are cores."
        )

    def limit_duplicates(self) -> str:
        u_wall, u_client, u_server = self.split("duplicate_deliver")
        s_wall, _, _ = self.split("duplicate_store")
        rt_u = self.rt.get("duplicate_deliver", {})
        dup = self.median("duplicate_deliver")
        goal = self.targets["duplicates"]
        trips = rt_u.get("round_trips_per_message", 4)
        per_rt = (u_wall - s_wall) / max(1.0, trips - 1)
        separate_select = any(s.startswith("SELECT") for s in rt_u.get("statements", []))
        how = (
            "The conflicting INSERT runs inside `transaction.atomic()` (it must, for a new "
            "message), so a duplicate pays a BEGIN and a COMMIT of an empty transaction, then "
            "`_deliver_existing` asks for the status with a separate SELECT. "
            if separate_select
            else "The existing row's status comes back with the INSERT (one CTE); what is "
            "left is the BEGIN and COMMIT of the empty transaction around it (the INSERT must "
            "run inside `transaction.atomic()` for a new message). "
        )
        fix = (
            "Returning the existing row's status from the INSERT statement itself (one CTE) "
            "saves the SELECT; prepared statements cut the server's parse and plan; 10,000/s "
            "needs both and fewer Python layers per call."
            if separate_select
            else "Prepared statements would cut the server's parse and plan; the rest is "
            "Python per call (validation, Django's atomic and cursor wrappers, psycopg)."
        )
        return (
            f"- **3. duplicates = {_f(dup)} msg/s, {_verdict(dup >= goal)}** (goal {_f(goal)} "
            f"msg/s = {_f(_us(goal))} µs/msg; measured {_f(u_wall)} µs/msg: {_f(u_client)} µs "
            f"client CPU, {_f(u_server)} µs PostgreSQL CPU). "
            f"{rt_u.get('round_trips_per_message', 0):g} round trips: "
            f"{', '.join(rt_u.get('statements', []))}. {how}store() of the same duplicate, "
            f"one autocommit statement, takes {_f(s_wall)} µs, so each extra round trip with "
            f"its Python costs about {_f(per_rt)} µs. {fix}"
        )

    def limit_store(self) -> str:
        st_wall, st_client, st_server = self.split("store_single")
        return (
            f"- **4. store() = {_f(self.median('store_single'))} msg/s** one per transaction "
            f"({_f(st_wall)} µs/msg: {_f(st_client)} µs client CPU, {_f(st_server)} µs "
            "PostgreSQL CPU, one round trip that also commits); inside one transaction "
            f"{_f(self.median('store_batched'))} msg/s (no commit per message)."
        )

    def limits(self) -> list[str]:
        return [
            self.limit_deliver(),
            self.limit_drain(),
            self.limit_duplicates(),
            self.limit_store(),
            *self.limit_consume(),
        ]

    # --------------------------------------------------------------------- 5. consume

    def consume_ratio(
        self, top: str = "consume_rabbitmq", bottom: str = "consume_rabbitmq_plain"
    ) -> tuple[float, str]:
        """inbox_consume / plain: the median of the per-run ratios (the runs are interleaved,
        so each ratio compares two runs under about the same load), else the ratio of the
        medians; and how it was taken."""
        paired = self.paired(top, bottom)
        if paired:
            return statistics.median(paired), "median of the interleaved runs' ratios"
        return self.ratio(top, bottom) or 0.0, "of medians"

    def steps(self, kind: str) -> tuple[dict[str, tuple[float, float]], float]:
        """py-spy's steps of a message in the profiled run of ``kind``, as (µs, µs waiting for
        PostgreSQL) per message of that run, and that run's wall µs per message."""
        found = self.consume.get("profiles", {}).get(f"{kind}_py-spy", {})
        wall = float(found.get("wall_us_per_msg") or 0.0)
        return {
            label: (step["share"] * wall, step["waiting_for_postgresql"] * wall)
            for label, step in found.get("steps", {}).items()
        }, wall

    def step_table(self) -> list[str]:
        (inbox, i_wall), (plain, p_wall) = self.steps("inbox"), self.steps("plain")
        if not inbox or not plain:
            return []
        profiles = self.consume.get("profiles", {})

        def walls(kind: str) -> str:
            runs = profiles.get(f"{kind}_py-spy", {}).get("runs_wall_us_per_msg", [])
            return " of " + ", ".join(_f(w) for w in runs) if len(runs) > 1 else ""

        rows = [
            f"| step of one message | inbox_consume µs/msg (profiled run: {_f(i_wall)}"
            f"{walls('inbox')}) | of which waiting for PostgreSQL | plain kombu µs/msg "
            f"(profiled run: {_f(p_wall)}{walls('plain')}) | of which waiting |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        labels = list(inbox) + [label for label in plain if label not in inbox]
        for label in labels:
            i, p = inbox.get(label), plain.get(label)
            mark = "" if p else " (inbox only)"
            rows.append(
                f"| {label}{mark} | {_f(i[0]) if i else '-'} | {_f(i[1]) if i else '-'} | "
                f"{_f(p[0]) if p else '-'} | {_f(p[1]) if p else '-'} |"
            )
        return rows

    def limit_consume(self) -> list[str]:
        if not self.median("consume_rabbitmq"):
            return []
        c_wall, c_client, c_server = self.split("consume_rabbitmq")
        p_wall, p_client, p_server = self.split("consume_rabbitmq_plain")
        goal_ratio, goal = self.targets["consume_vs_plain"], self.targets["consume"]
        ratio, how = self.consume_ratio()
        of_medians = self.ratio("consume_rabbitmq", "consume_rabbitmq_plain") or 0.0
        rate = self.median("consume_rabbitmq")
        paired = ", ".join(
            f"{r:.2f}" for r in self.paired("consume_rabbitmq", "consume_rabbitmq_plain")
        )
        inbox_fig = self.fig["consume_rabbitmq"]
        plain_fig = self.fig.get("consume_rabbitmq_plain", {})
        detail = inbox_fig.get("runs_detail", [{}])[0]
        prefetch = inbox_fig.get("prefetch")
        busy = inbox_fig.get("machine_busy_cores") or [0.0]
        other = inbox_fig.get("other_processes_cores") or [0.0]
        profiles = self.consume.get("profiles", {})
        ci = profiles.get("inbox_cprofile", {})
        cp = profiles.get("plain_cprofile", {})
        calls_i, calls_p = ci.get("calls_per_msg", {}), cp.get("calls_per_msg", {})
        (inbox, _), (plain, _) = self.steps("inbox"), self.steps("plain")
        inbox_only = {k: v for k, v in inbox.items() if k not in plain}
        only_total = sum(v[0] for v in inbox_only.values())
        only_wait = sum(v[1] for v in inbox_only.values())

        def at(steps: dict[str, tuple[float, float]], name: str) -> str:
            return _f(steps.get(STEP_NAMES[name], (0.0, 0.0))[0])

        def waited(steps: dict[str, tuple[float, float]], name: str) -> str:
            return _f(steps.get(STEP_NAMES[name], (0.0, 0.0))[1])

        # what the inbox's INSERT step spent waiting for PostgreSQL (the BEGIN and INSERT
        # round trips, the server's parse, plan and execute): no Python can remove it
        floor = inbox.get(STEP_NAMES["insert"], (0.0, 0.0))[1]
        best = p_wall / (p_wall + floor) if p_wall + floor > 0 else 0.0
        allowed = p_wall * (1 / goal_ratio - 1)
        d_wall, _, _ = self.split("deliver")
        b_wall, _, _ = self.split("bare_django")
        statements_i = calls_i.get("SQL statements (psycopg client cursor execute)", 0) + (
            calls_i.get("SQL statements (psycopg execute)", 0)
        )
        statements_p = calls_p.get("SQL statements (psycopg client cursor execute)", 0) + (
            calls_p.get("SQL statements (psycopg execute)", 0)
        )
        loads = "; ".join(
            f"{n:g} from `{where}`" for where, n in ci.get("json_loads_callers", {}).items()
        )
        dumps = "; ".join(
            f"{n:g} from `{where}`" for where, n in ci.get("json_dumps_callers", {}).items()
        )
        missing = calls_i.get("Django settings lookups (LazySettings.__getattr__)", 0)
        settings = (
            f" {missing:g} lookups per message of `INBOX_*` settings that are not set (each "
            "a `LazySettings.__getattr__` that ends in AttributeError, since Django caches only "
            "settings that exist; about a microsecond each);"
            if missing >= 0.5
            else ""
        )
        cumulative = ci.get("cumulative", {})

        def cum(name: str) -> str:
            for where, found in cumulative.items():
                if where.endswith(f"({name})"):
                    return _f(found["cumulative_us_per_msg"])
            return "-"

        broker_i = inbox_fig.get("broker_cpu_us_per_msg")
        broker_p = plain_fig.get("broker_cpu_us_per_msg")
        lines = [
            f"- **5. inbox_consume = {_f(rate)} msg/s from RabbitMQ in one process, "
            f"{_verdict(rate >= goal)} (goal {_f(goal)}); against the plain kombu consumer "
            f"({_f(self.median('consume_rabbitmq_plain'))} msg/s) {ratio:.2f}, "
            f"{_verdict(ratio >= goal_ratio)} (goal {goal_ratio:.2f})** ({how}: {paired or '-'}; "
            f"ratio of the medians {of_medians:.2f}). The rate runs from the first to the last "
            "message: the inbox rows' `received_at` (stamped by `deliver()` as it starts a "
            "message) and, for the baseline, its own clock at the same point; the consumer's "
            f"start-up ({detail.get('startup_s')} s: interpreter, Django set-up, connecting) "
            "and its final 2 s `--until-idle` wait are excluded (the whole `manage.py` process "
            f"ran {detail.get('process_wall_s')} s for {_f(detail.get('messages'))} messages). "
            f"Both consumers ran with prefetch {prefetch} and CONN_MAX_AGE=None, each on "
            f"{detail.get('postgresql_connections_opened')} PostgreSQL connection for the whole "
            f"run. inbox_consume takes {_f(c_wall)} µs/msg, the plain consumer {_f(p_wall)}: "
            f"+{_f(c_wall - p_wall)} µs, of which consumer CPU +{_f(c_client - p_client)} µs "
            f"and PostgreSQL backend CPU +{_f(c_server - p_server)} µs. RabbitMQ itself used "
            f"{_f(broker_i)} µs of CPU per message (inbox runs) and {_f(broker_p)} µs (plain "
            f"runs) on the same cores; the machine was {_f(statistics.median(busy), 2)} of "
            f"{self.data['facts']['nproc']} cores busy during the inbox runs, "
            f"{_f(statistics.median(other), 2)} of them neither the consumer nor its backend "
            "(RabbitMQ, the benchmark's sampler, other work). In process (section 1, no "
            f"broker, run minutes earlier) deliver() took {_f(d_wall)} µs and the bare handler "
            f"{_f(b_wall)} µs (+{_f(d_wall - b_wall)}).",
            "",
            f"  Per message (cProfile call counts, {_f(ci.get('messages'))} messages): "
            f"{statements_i:g} SQL statements against {statements_p:g}, plus BEGIN and COMMIT "
            "each (the inbox's `INSERT … ON CONFLICT DO NOTHING RETURNING id` before the "
            f"handler's UPDATE); `json.loads` {calls_i.get('json.loads', 0):g} times ({loads}) "
            f"against {calls_p.get('json.loads', 0):g}, `json.dumps` "
            f"{calls_i.get('json.dumps', 0):g} ({dumps}); "
            f"{calls_i.get('model __init__', 0):g} Django model `__init__` (the `InboxMessage` "
            f"the handler receives);{settings} on both sides "
            f"{calls_i.get('amqp frames read', 0):g} AMQP frames read, one `basic.ack` written "
            "and one `close_old_connections()`. Cumulative µs per message under cProfile "
            f"(inflated by it): `deliver` {cum('deliver')}, of which `insert_row` "
            f"{cum('insert_row')}, the handler {cum('take_one')}, `_materialise` "
            f"{cum('_materialise')}, `_prepare` {cum('_prepare')}; envelope `parse` "
            f"{cum('parse')}; `ack` {cum('ack')}; `_between_messages` "
            f"{cum('_between_messages')}.",
            "",
            "  Where a message's time goes, from py-spy (`--idle`: wall-clock samples of the "
            "real `manage.py inbox_consume` process and of the plain consumer; untimed runs, "
            "two of each, the least disturbed kept; a sample belongs to the first step found "
            "under the per-message callback; the steps both consumers have differ between the "
            "two columns mostly by the machine's load at the time):",
            "",
            *self.step_table(),
            "",
            f"  The steps only the inbox has take {_f(only_total)} µs per message in the "
            f"profiled run ({_f(only_wait)} of them waiting for PostgreSQL): the INSERT with "
            f"its round trip and the BEGIN psycopg sends before it ({at(inbox, 'insert')} µs, "
            f"{waited(inbox, 'insert')} waiting; PostgreSQL parses and plans the INSERT text "
            "afresh every time, since Django binds parameters client-side), building the "
            f"`InboxMessage` ({at(inbox, 'materialise')} µs), validating and JSON-encoding "
            f"({at(inbox, 'prepare')} µs), reading the envelope ({at(inbox, 'envelope')} µs), "
            f"the loop's `_between_messages` ({at(inbox, 'sweep')} µs: a poll-interval check "
            "per message and a sweep for due retries once a second). Shared steps, inbox and "
            f"plain: the ORM handler {at(inbox, 'handler')} and {at(plain, 'handler')} µs, "
            f"COMMIT {at(inbox, 'commit')} and {at(plain, 'commit')} µs (mostly waiting for the "
            f"WAL flush), reading the frames and building the kombu message "
            f"{at(inbox, 'broker')} and {at(plain, 'broker')} µs, the ack {at(inbox, 'ack')} "
            f"and {at(plain, 'ack')} µs. The floor: the INSERT step waits {_f(floor)} µs for "
            "PostgreSQL (BEGIN and INSERT round trips, the server parsing, planning and "
            "running the INSERT), so an inbox with no Python cost at all would reach "
            f"{best:.2f} against this {_f(p_wall)} µs consumer; "
            f"{goal_ratio:.2f} allows {_f(allowed)} µs of inbox per message, the inbox adds "
            f"{_f(c_wall - p_wall)} in the medians. The absolute goal, {_f(goal)} msg/s, is "
            f"{_f(_us(goal))} µs/msg; the plain consumer, without any inbox, takes "
            f"{_f(p_wall)} µs on this machine.",
        ]
        lines += self.consume_info()
        return lines

    def consume_info(self) -> list[str]:
        lines = []
        p_wall = _us(self.median("consume_rabbitmq_plain"))
        c_wall = _us(self.median("consume_rabbitmq"))
        spread_i = ", ".join(_f(_us(r)) for r in self.fig["consume_rabbitmq"]["runs"])
        spread_p = ", ".join(
            _f(_us(r)) for r in self.fig.get("consume_rabbitmq_plain", {}).get("runs", [])
        )
        if self.median("consume_rabbitmq_store"):
            s_wall, s_client, s_server = self.split("consume_rabbitmq_store")
            lines.append(
                f"- **5. `--ack after-store` = {_f(self.median('consume_rabbitmq_store'))} "
                f"msg/s** ({_f(s_wall)} µs/msg: {_f(s_client)} consumer CPU, {_f(s_server)} "
                "PostgreSQL CPU): per message `store()`, one autocommit INSERT that also "
                "commits, then the ack; no handler runs (inbox_process runs it later, section "
                "2), and no sweep (off in this mode): "
                f"{(self.ratio('consume_rabbitmq_store', 'consume_rabbitmq_plain') or 0):.2f} "
                "times the rate of the plain consumer, which runs its handler."
            )
        if self.median("consume_rabbitmq_prefetch1"):
            i1 = _us(self.median("consume_rabbitmq_prefetch1"))
            p1 = _us(self.median("consume_rabbitmq_plain_prefetch1"))
            lines.append(
                f"- **5. prefetch 1**: inbox_consume "
                f"{_f(self.median('consume_rabbitmq_prefetch1'))} msg/s ({_f(i1)} µs), plain "
                f"{_f(self.median('consume_rabbitmq_plain_prefetch1'))} msg/s ({_f(p1)} µs): "
                f"{i1 - c_wall:+,.0f} µs (inbox) and {p1 - p_wall:+,.0f} µs (plain) against "
                f"the default prefetch's medians (single runs; the default's runs spread over "
                f"{spread_i} and {spread_p} µs). With one message in flight the next delivery "
                "leaves RabbitMQ only once the ack arrived, so each message adds a loopback round "
                "trip and RabbitMQ's turn on a shared core; with prefetch "
                f"{self.fig['consume_rabbitmq'].get('prefetch')} the next message is already in "
                "the socket buffer."
            )
        if self.median("consume_rabbitmq_age0"):
            a = self.fig["consume_rabbitmq_age0"]
            ap = self.fig.get("consume_rabbitmq_plain_age0", {})
            a_wall, pa_wall = _us(a["median"]), _us(ap.get("median", 0.0))
            opened = a.get("runs_detail", [{}])[0].get("postgresql_connections_opened")
            opened_p = ap.get("runs_detail", [{}])[0].get("postgresql_connections_opened")
            rt = self.rt.get("drain", {})
            lines.append(
                f"- **5. CONN_MAX_AGE=0 (Django's default)**: inbox_consume {_f(a['median'])} "
                f"msg/s ({_f(a_wall)} µs), plain {_f(ap.get('median'))} msg/s ({_f(pa_wall)} "
                f"µs), on {_f(a.get('messages'))} messages for which they opened {opened} and "
                f"{opened_p} PostgreSQL connections (pg_stat_database.sessions). Any Django "
                "consumer calls `close_old_connections()` between messages "
                "(`BrokerConsumer._on_message` in django_inbox/consumer/loop.py does, first "
                "thing for every message; so does the baseline), and with CONN_MAX_AGE=0 that "
                "closes the connection: each message opens a new PostgreSQL connection, a new "
                "backend process with cold catalog caches. "
                f"+{_f(a_wall - c_wall)} µs per message for the inbox, +{_f(pa_wall - p_wall)} "
                f"µs for the plain consumer (Django's connect alone: {rt.get('connect_ms')} "
                "ms). Consumers need CONN_MAX_AGE > 0 or None (with CONN_HEALTH_CHECKS=True to "
                "survive a dropped connection)."
            )
        if self.median("consume_redis"):
            r_wall, r_client, r_server = self.split("consume_redis")
            rp_wall, rp_client, rp_server = self.split("consume_redis_plain")
            redis_cpu = self.fig["consume_redis"].get("broker_cpu_us_per_msg")
            r_ratio, r_how = self.consume_ratio("consume_redis", "consume_redis_plain")
            r_runs = ", ".join(
                f"{r:.2f}" for r in self.paired("consume_redis", "consume_redis_plain")
            )
            lines.append(
                f"- **5. Redis**: inbox_consume {_f(self.median('consume_redis'))} msg/s "
                f"({_f(r_wall)} µs: {_f(r_client)} consumer CPU, {_f(r_server)} PostgreSQL "
                f"CPU), plain kombu {_f(self.median('consume_redis_plain'))} msg/s "
                f"({_f(rp_wall)} µs: {_f(rp_client)} consumer CPU, {_f(rp_server)} PostgreSQL "
                f"CPU), ratio {r_ratio:.2f} ({r_how}{': ' + r_runs if r_runs else ''}). "
                "kombu's Redis transport pays three Redis round trips a message whatever the "
                "prefetch: BRPOP to fetch it, a pipelined ZADD + HSET recording it as unacked "
                "(with the message JSON-encoded again), and a pipelined ZREM + HDEL for the "
                f"ack; redis-server used {_f(redis_cpu)} µs CPU per message. Against RabbitMQ: "
                f"{r_wall - c_wall:+,.0f} µs for the inbox, {rp_wall - p_wall:+,.0f} µs for "
                "the plain consumer."
            )
        return lines

    # --------------------------------------------------------------------- documents

    def header(self) -> list[str]:
        facts = self.data["facts"]
        cfg = self.data["config"]
        pg = facts["postgresql_settings"]
        return [
            f"Command: `./scripts/bench` · {facts['date']} · {facts['bench_seconds']:.0f} s · "
            f"N={cfg['BENCH_N']} per run, {cfg['BENCH_RUNS']} runs (median), warm-up "
            f"{cfg['warmup']}, drain N={cfg['BENCH_DRAIN_N']} ({cfg['BENCH_DRAIN_RUNS']} runs), "
            f"pgbench {cfg['BENCH_PGBENCH_SECONDS']} s.",
            "",
            f"Machine: {facts['nproc']} cores ({facts['platform']}), load average "
            f"{facts['load_average_at_start']} at start and {facts['load_average_at_end']} at "
            "end (other work may share this machine and this PostgreSQL server: see the "
            f'"machine busy" column); {facts["postgresql"]}, fsync={pg.get("fsync")}, '
            f"synchronous_commit={pg.get('synchronous_commit')}, wal_sync_method="
            f"{pg.get('wal_sync_method')}, full_page_writes={pg.get('full_page_writes')}, "
            f"autovacuum={pg.get('autovacuum')} (the bench vacuums between runs), "
            f"shared_buffers={pg.get('shared_buffers')}; Python {facts['python']}, Django "
            f"{facts['django']}, psycopg {facts['psycopg']}; {facts['django_settings']}; "
            f"code measured: {facts.get('code', 'unknown')}.",
        ]

    def markdown(self) -> str:
        lines = [
            "# django-transactional-inbox benchmark",
            "",
            *self.header(),
            "",
            "## Targets",
            "",
            *self.targets_table(),
            "",
            "## What limits each figure",
            "",
            *self.limits(),
            "",
            "## Figures",
            "",
            *self.figures_table(),
            "",
            "Client CPU is the CPU time of the process running the inbox (this one, the "
            "inbox_process subprocesses, or the consumer subprocess of section 5, between its "
            "first and last message); server CPU is its PostgreSQL backend's, read from "
            '/proc in 10 ms ticks. "Machine busy" is every process on the machine: about 1 '
            "core is this benchmark, the rest is other work. pgbench rows are transactions/s, "
            'a transaction standing for a message. "Prepared statements" means Django '
            '`OPTIONS = {"server_side_binding": True, "prepare_threshold": 5}`.',
            "",
            "## Ratios",
            "",
            *self.ratios_table(),
            "",
            "## Where the time goes",
            "",
            *self.time_table(),
            "",
            '"rest" is wall time neither process spent on a CPU: network latency, WAL flush '
            "at commit, waiting for a core.",
            "",
            "### Round trips, counted on the wire (libpq trace)",
            "",
            *self.round_trip_table(),
            "",
            "### cProfile (one profiled run each; the profiler inflates Python time)",
            "",
            *self.profile_section(),
            "",
            "### py-spy of the consumer processes (section 5; wall clock, `--idle`, 400 Hz)",
            "",
            *self.pyspy_section(),
            "",
        ]
        return "\n".join(lines)

    def summary(self) -> str:
        return "\n".join(
            [
                *self.header(),
                "",
                *self.targets_table(),
                "",
                *self.figures_table(),
                "",
                *self.ratios_table(),
                "",
                *self.limits(),
            ]
        )


def write_report(results: Path, **data: Any) -> str:
    """Write ``latest.json`` and ``latest.md`` into ``results``; return the text to print."""
    results.mkdir(parents=True, exist_ok=True)
    report = Report(data)
    (results / "latest.json").write_text(json.dumps(data, indent=2) + "\n")
    (results / "latest.md").write_text(report.markdown())
    return report.summary()
