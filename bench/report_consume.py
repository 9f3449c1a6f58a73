"""The report's analysis of the broker consumers (figure 5): steps per message, where the
time goes, and what limits ``inbox_consume`` against the plain kombu consumer."""

from __future__ import annotations

import statistics

from bench.report_data import STEP_NAMES, ReportData, _f, _us, _verdict


class ConsumeAnalysis(ReportData):
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
            "and one connection check (`keep_connection()`, or the baseline's "
            "`close_old_connections()`). Cumulative µs per message under cProfile "
            f"(inflated by it): `deliver` {cum('deliver')}, of which `insert` "
            f"{cum('insert')}, the handler {cum('take_one')}, `materialise` "
            f"{cum('materialise')}, `prepare` {cum('prepare')}; envelope `parse` "
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
                "consumer that calls `close_old_connections()` between messages (the baseline "
                "does) opens, under CONN_MAX_AGE=0, a new PostgreSQL connection, a new backend "
                "process with cold catalog caches, for each message; `inbox_consume` keeps its "
                "connection while it is healthy (`keep_connection()` in "
                "django_inbox/db/connection.py). "
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
