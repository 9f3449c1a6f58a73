"""The report's tables: targets, figures, ratios, time split, round trips, profiles."""

from __future__ import annotations

import statistics

from bench.report_data import ORDER, ReportData, _f, _us, _verdict


class Tables(ReportData):
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
