"""The report's "what limits it" lines for ``deliver()``, the drain, duplicates and ``store()``,
written from the numbers of the same run."""

from __future__ import annotations

from bench.report_data import ReportData, _f, _us, _verdict


class Limits(ReportData):
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
            "the fenced completion UPDATE, COMMIT; the claim adds 5 per batch of 100) and "
            "one commit. The handler alone is the bare baseline, "
            f"{_f(b_wall)} µs/msg, already over the {_f(_us(goal))} µs budget: one Python "
            "process running an ORM handler cannot drain 5,000 msg/s on this machine. On top, "
            f"`Worker.run()` opened {first.get('connections_opened')} connection(s) for "
            f"{_f(first.get('messages'))} messages: it keeps its connection while it is "
            "healthy, even under CONN_MAX_AGE=0 (Django's default, the test project's), where "
            "a per-loop `close_old_connections()` would reconnect after each batch. Django "
            f"connects in {rt.get('connect_ms')} ms and a "
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
            "`deliver_existing` asks for the status with a separate SELECT. "
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

    def limit_ordered(self) -> str | None:
        if not self.median("drain_ordered"):
            return None
        un_wall, un_client, un_server = self.split("drain_unordered")
        or_wall, or_client, or_server = self.split("drain_ordered")
        swapped = self.data["figures"].get("drain_ordered_swapped", {})
        released = swapped.get("us_per_released")
        return (
            f"- **2d. ordered drain = {_f(self.median('drain_ordered'))} msg/s against "
            f"{_f(self.median('drain_unordered'))} unordered** (100 keys, each in order, "
            f"in process): {_f(or_wall)} µs/msg against {_f(un_wall)} ({_f(or_client)} "
            f"against {_f(un_client)} µs client CPU, {_f(or_server)} against {_f(un_server)} "
            "µs PostgreSQL CPU). An ordered version costs one round trip more: the key's lock "
            "(`SELECT … FOR UPDATE SKIP LOCKED`, which also records the version applied when "
            "it is the key's next) at the start of its transaction; its completion and the "
            "release of the next version are one statement, as the plain completion is."
            + (
                f" With each key's versions stored in swapped pairs (half of them wait once), "
                f"{_f(self.median('drain_ordered_swapped'))} msg/s: one waiting-then-released "
                f"message costs {_f(released)} µs more (its claim, the key's lock and its "
                "setting aside in a transaction of its own, then a claim by its id when its "
                "predecessor releases it)."
                if released
                else ""
            )
        )

    def limit_commit_every(self) -> str | None:
        if not self.median("drain_commit_every") or not self.median("drain_bare_batched"):
            return None
        ce_wall, ce_client, _ = self.split("drain_commit_every")
        one_wall, _, _ = self.split("drain_bare_small")
        batched_wall, batched_client, _ = self.split("drain_bare_batched")
        goal = self.data["targets"].get("ratios", {}).get("commit_every_bare")
        ratio = self.ratio("drain_commit_every", "drain_bare_small") or 0.0
        ceiling = self.ratio("drain_bare_batched", "drain_bare_small") or 0.0
        near = self.ratio("drain_commit_every", "drain_bare_batched") or 0.0
        reach = "" if goal is None else f", goal {_f(goal, 2)}"
        return (
            f"- **2e. drain with `commit_every=100` = {_f(ratio, 2)} times the bare "
            f"per-message loop{reach}** ({_f(ce_wall)} µs/msg, {_f(ce_client)} µs client CPU, "
            f"against {_f(one_wall)} µs). The ceiling is the handlers themselves: a bare "
            f"`atomic()` loop running 100 handlers per transaction, with no inbox at all, takes "
            f"{_f(batched_wall)} µs/msg ({_f(batched_client)} µs client CPU: Django's ORM "
            f"building and sending each UPDATE), {_f(ceiling, 2)} times the per-message loop"
            + (
                f", so no inbox can reach {_f(goal, 2)} with this handler on this machine"
                if goal is not None and ceiling < goal
                else ""
            )
            + f". The drain runs at {_f(near, 2)} of that ceiling: the claim (one statement "
            "per 100), the completion of the 100 in one `UPDATE`, and per message the "
            "`InboxMessage` it builds, the handler's context and the events it sends."
        )

    def limit_outbox(self) -> str | None:
        if not self.median("outbox_relay"):
            return None
        bare_wall, _, _ = self.split("outbox_bare_tx")
        pub_wall, pub_client, pub_server = self.split("outbox_publish")
        relay = self.data["figures"].get("outbox_relay", {})
        ceiling = self.ratio("outbox_round_trip", "outbox_bare_tx")
        floor = self.ratio("outbox_raw_insert", "outbox_raw_bare")
        goal = self.data["targets"].get("ratios", {}).get("publish_overhead")
        lag = (
            f" Under a steady load ({_f(relay.get('lag_rate'))} rows/s written), a row is sent "
            f"{_f(relay.get('lag_p50_ms'))} ms after it was written (p50), "
            f"{_f(relay.get('lag_p99_ms'))} ms (p99)."
            if relay.get("lag_p50_ms") is not None
            else ""
        )
        return (
            f"- **8. outbox: a business transaction with `publish()` = {_f(pub_wall)} µs against "
            f"{_f(bare_wall)} without** ({_f(pub_client)} µs client CPU, {_f(pub_server)} µs "
            "PostgreSQL CPU with it): one more round trip, the prepared `INSERT` of the row and "
            "its index entries (five for a keyed row: the primary key, the message id's unique "
            "index and Django's `LIKE` index beside it, the pending and the key indexes)."
            + (
                f" The same transaction with one `SELECT 1` more runs at {_f(ceiling, 2)} of "
                "the bare one: no `publish()` that writes in the caller's transaction can do "
                "better than that round trip."
                if ceiling
                else ""
            )
            + (
                f" Raw psycopg sending the same prepared `INSERT` in the same transaction, with "
                f"no Python of ours, runs at {_f(floor, 2)} of its own bare transaction"
                + (
                    f": a floor under the goal of {_f(goal, 2)}, which leaves "
                    f"{_f(bare_wall * (1 / goal - 1))} µs for everything `publish()` does "
                    "(round trip, the row's server work, validation and JSON)"
                    if goal is not None and floor < goal
                    else ""
                )
                + "."
                if floor
                else ""
            )
            + " **The relay publishes "
            f"{_f(self.median('outbox_relay'))} msg/s against "
            f"{_f(self.median('outbox_kombu'))} for a plain kombu producer** waiting for each "
            "confirm: the relay publishes a batch of 100, then waits for their confirms "
            "together, and marks them sent in one `UPDATE`." + lag
        )

    def limits(self) -> list[str]:
        found = [
            self.limit_deliver(),
            self.limit_drain(),
            self.limit_commit_every(),
            self.limit_ordered(),
            self.limit_outbox(),
            self.limit_duplicates(),
            self.limit_store(),
            *self.limit_consume(),
        ]
        return [line for line in found if line]

    # --------------------------------------------------------------------- 5. consume
