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
]


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
        for key, found in self.prof.items():
            groups = ", ".join(
                f"{g} {share:.0%}"
                for g, share in found["python_share_by_group"].items()
                if share >= 0.02
            )
            lines.append(
                f"- **{key}** ({found['messages']} messages, {found['profiled_us_per_msg']:.0f} "
                f"µs/msg under the profiler): waiting for PostgreSQL "
                f"{found['waiting_share']:.0%} of profiled time. Python time: {groups}."
            )
            top = "; ".join(
                f"`{t['where']}` {t['share']:.0%} ({t['calls_per_msg']:g}/msg)"
                for t in found["top_python_functions"][:6]
            )
            lines.append(f"  Top Python functions: {top}.")
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
        ]

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
            "Client CPU is the CPU time of the process running the inbox (this one, or the "
            "inbox_process subprocesses); server CPU is its PostgreSQL backend's, read from "
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
