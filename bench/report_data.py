"""What the report's parts share: the run's data, medians and ratios, number formats."""

from __future__ import annotations

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
    ("2c", "drain_command_small"),
    ("2c", "drain_bare_small"),
    ("2c", "drain_procrastinate"),
    ("2c", "drain_bare_batched"),
    ("2d", "drain_unordered"),
    ("2d", "drain_ordered"),
    ("2d", "drain_ordered_swapped"),
    ("8", "outbox_bare_tx"),
    ("8", "outbox_round_trip"),
    ("8", "outbox_publish"),
    ("8", "outbox_raw_bare"),
    ("8", "outbox_raw_insert"),
    ("8a", "outbox_relay"),
    ("8a", "outbox_kombu"),
    ("2", "store_batched"),
    ("3", "duplicate_deliver"),
    ("3a", "duplicate_raw"),
    ("", "duplicate_alternating"),
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
    "insert": "deliver: inbox INSERT (insert)",
    "materialise": "deliver: build InboxMessage (materialise)",
    "prepare": "deliver: prepare (validate, JSON-encode)",
    "envelope": "envelope: read properties, decode body and headers",
    "commit": "atomic() exit: COMMIT",
    "handler": "handler: ORM UPDATE (take_one)",
    "broker": "broker: read frames, build the kombu message",
    "ack": "message.ack()",
    "sweep": "loop: _between_messages (sweep for due retries once a second)",
    "close": "keep_connection()",
}


def _f(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _us(rate: float) -> float:
    return 1e6 / rate if rate else 0.0


def _verdict(ok: bool) -> str:
    return "reached" if ok else "missed"


class ReportData:
    """One benchmark run's results, read by every part of the report."""

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
