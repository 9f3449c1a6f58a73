"""The report's ratio targets: each figure of the performance goals as a ratio of two
figures measured in the same run, with its goal and whether it was reached."""

from __future__ import annotations

from bench.report_data import ReportData, _f, _verdict

#: (label, numerator, denominator, key of the goal in ``RATIO_TARGETS``, goal is a minimum)
RATIOS = [
    ("deliver() / bare `atomic()`, same one-row handler", "deliver", "bare_django", "deliver_bare"),
    (
        "deliver() / raw psycopg doing the same work (prepared, one transaction)",
        "deliver",
        "raw_psycopg_inbox",
        "deliver_raw_inbox",
    ),
    (
        "drain by `manage.py inbox_process` (start-up included) / bare `atomic()` loop",
        "drain_command_small",
        "drain_bare_small",
        "command_bare",
    ),
    (
        "drain by `manage.py inbox_process` / procrastinate, same UPDATE",
        "drain_command_small",
        "drain_procrastinate",
        "command_procrastinate",
    ),
    (
        "drain in process (`Worker.run()`) / procrastinate, same UPDATE",
        "drain_small",
        "drain_procrastinate",
        "command_procrastinate",
    ),
    (
        "drain with `commit_every=100` / bare `atomic()` loop, same handler",
        "drain_commit_every",
        "drain_bare_small",
        "commit_every_bare",
    ),
    (
        "a bare `atomic()` loop of 100 handlers per transaction / the bare loop of one (the "
        "ceiling for commit_every_bare: the handlers alone, no inbox)",
        "drain_bare_batched",
        "drain_bare_small",
        "commit_every_ceiling",
    ),
    (
        "drain with `commit_every=100` / a bare `atomic()` loop of 100 handlers per "
        "transaction (how near the inbox comes to that ceiling)",
        "drain_commit_every",
        "drain_bare_batched",
        "commit_every_batched",
    ),
    (
        "duplicate rejection: deliver() / raw psycopg floor",
        "duplicate_deliver",
        "duplicate_raw",
        "duplicate_floor",
    ),
    (
        "RabbitMQ: inbox_consume / plain kombu consumer, same handler",
        "consume_rabbitmq",
        "consume_rabbitmq_plain",
        "consume_plain",
    ),
    (
        "inbox_consume with `CONN_MAX_AGE=0` / with persistent connections",
        "consume_rabbitmq_age0",
        "consume_rabbitmq",
        "age0_persistent",
    ),
    (
        "ordered drain, 100 keys in order / unordered drain, same handler (in process)",
        "drain_ordered",
        "drain_unordered",
        "ordered_unordered",
    ),
    (
        "outbox: transaction with publish() / the same transaction without it",
        "outbox_publish",
        "outbox_bare_tx",
        "publish_overhead",
    ),
    (
        "one more round trip: the transaction + SELECT 1 / the transaction alone (a ceiling for"
        " publish_overhead)",
        "outbox_round_trip",
        "outbox_bare_tx",
        "round_trip_ceiling",
    ),
    (
        "outbox floor: raw psycopg transaction + the outbox INSERT / the transaction alone",
        "outbox_raw_insert",
        "outbox_raw_bare",
        "publish_floor",
    ),
    (
        "outbox: relay (batched confirms, rows marked sent) / plain kombu producer with confirms",
        "outbox_relay",
        "outbox_kombu",
        "relay_kombu",
    ),
]


class RatioTargets(ReportData):
    def ratio_targets_table(self) -> list[str]:
        goals = self.data["targets"].get("ratios", {})
        rows = [
            "| figure | ratio of medians | per interleaved run | goal | result |",
            "| --- | ---: | --- | ---: | --- |",
        ]
        for label, top, bottom, goal_key in RATIOS:
            goal = goals.get(goal_key)
            wanted = "for information" if goal is None else f"≥ {_f(goal, 2)}"
            ratio = self.ratio(top, bottom)
            if ratio is None:
                rows.append(f"| {label} | not measured | | {wanted} | |")
                continue
            runs = ", ".join(f"{value:.2f}" for value in self.paired(top, bottom)) or "-"
            verdict = "" if goal is None else f"**{_verdict(ratio >= goal)}**"
            rows.append(f"| {label} | {ratio:.2f} | {runs} | {wanted} | {verdict} |")
        return rows
