"""Figure 8: what versions waiting behind a dead one cost a worker's other consumers.

An ordered consumer's key whose version is ``dead`` holds its later versions ``waiting`` (the
documented "sequenced dead letters") until an operator acts. One worker runs that ordered
consumer and an unrelated plain one (``bench``); the figure is the plain consumer's drain of
``DRAIN_SMALL`` stored messages with 0, 10,000 and 100,000 such waiting rows (10 keys), under
a 1-second ``gap_timeout``, interleaved in every run. Target: the drain with them at least 0.9
of the drain without.

The waiting rows are made by ``deliver()`` as the inbox makes them (the first 100 of each
key: the bench checks that they have no deadline, which is what keeps the gap sweep away from
them), and the rest are copied from those in one ``INSERT … SELECT``; all are dated an hour
back, so any deadline-based sweep would find them due. The gap sweep's own time is measured
too (``park_expired_gaps`` for the ordered consumer, median of 20 calls).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.config import DRAIN_SMALL, RUNS, bench_sql, log, truncate_inbox, vacuum
from bench.timing import Series, django_backend_pid, measuring, payload

KEYS = 10
SIZES = (0, 10_000, 100_000)
#: Versions per key made through ``deliver()``; the rest are copies of their shape.
DELIVERED = 100
TABLE = "django_inbox_inboxmessage"


def _waiting_rows(consumer: str, total: int) -> None:
    """Per key: version 1 dead, versions 2 … ``total // KEYS + 1`` waiting behind it."""
    from django.test import override_settings

    from bench.inbox_handlers import EVENT_TYPE
    from django_inbox import Outcome, deliver, store_dead

    if not total:
        return
    per_key = total // KEYS
    for k in range(KEYS):
        store_dead(
            consumer=consumer, message_id=f"dead-{k}", event_type=EVENT_TYPE,
            payload=payload(k), reason="bench: a dead version", key=f"w{k}", sequence=1,
        )  # fmt: skip
    with override_settings(INBOX_CONSUMERS=_policy(consumer)):
        for k in range(KEYS):
            for sequence in range(2, min(per_key, DELIVERED) + 2):
                outcome = deliver(
                    consumer=consumer, message_id=f"w{k}-{sequence}", event_type=EVENT_TYPE,
                    payload=payload(sequence), key=f"w{k}", sequence=sequence,
                )  # fmt: skip
                if outcome != Outcome.WAITING:
                    raise RuntimeError(f"w{k}-{sequence}: {outcome}, not waiting")
    deadlines = bench_sql(
        f"SELECT count(*) FROM {TABLE} WHERE status = 'waiting' AND next_attempt_at IS NOT NULL"
    )[0][0]
    if deadlines:
        raise RuntimeError(f"{deadlines} waiting rows behind a dead version have a deadline")
    if per_key > DELIVERED:
        bench_sql(
            f"INSERT INTO {TABLE} (consumer, message_id, source, event_type, key, sequence, "
            "payload, headers, status, attempts, last_error, history, received_at, updated_at, "
            "next_attempt_at, locked_until, lease_id, processed_at, rerun, skip_requested) "
            "SELECT t.consumer, t.key || '-' || s, t.source, t.event_type, t.key, s, t.payload, "
            "t.headers, t.status, t.attempts, t.last_error, t.history, t.received_at, "
            "t.updated_at, t.next_attempt_at, t.locked_until, t.lease_id, t.processed_at, "
            f"t.rerun, t.skip_requested FROM {TABLE} t, "
            f"generate_series({DELIVERED + 2}, {per_key + 1}) s "
            f"WHERE t.status = 'waiting' AND t.sequence = {DELIVERED + 1}"
        )
    bench_sql(
        f"UPDATE {TABLE} SET updated_at = now() - interval '1 hour', "
        "received_at = now() - interval '1 hour' WHERE status = 'waiting'"
    )


def _policy(consumer: str) -> dict[str, Any]:
    from django.conf import settings

    return {**settings.INBOX_CONSUMERS, consumer: {"ordered": True, "gap_timeout": 1.0}}


def _store_plain(prefix: str, count: int) -> None:
    from django.db import transaction

    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import store

    with transaction.atomic():
        for i in range(count):
            store(
                consumer=CONSUMER, message_id=f"{prefix}-{i}", event_type=EVENT_TYPE,
                payload=payload(i),
            )  # fmt: skip


def _sweep_ms(consumer: str) -> float:
    from django.test import override_settings

    from django_inbox.ordered.gaps import park_expired_gaps

    took = []
    with override_settings(INBOX_CONSUMERS=_policy(consumer)):
        for _ in range(20):
            began = time.perf_counter()
            park_expired_gaps(consumer=consumer)
            took.append((time.perf_counter() - began) * 1000)
    return round(statistics.median(took), 3)


def bench_waiting() -> dict[str, Any]:
    from django.test import override_settings

    from bench.inbox_handlers import CONSUMER, ORDERED_CONSUMER
    from django_inbox.models import InboxKey
    from django_inbox.processing.worker import Worker

    count = DRAIN_SMALL
    log(
        f"\n== 8. a plain consumer's drain ({count} msgs) beside 0 / 10k / 100k versions "
        f"waiting behind dead ones, one worker, gap_timeout 1s ({RUNS} runs)"
    )
    series = {size: Series(f"drain beside {size:,} waiting rows, {count} msgs") for size in SIZES}
    sweeps: dict[int, float] = {}
    backend = django_backend_pid()
    for run in range(RUNS):
        for size in SIZES:
            truncate_inbox()
            InboxKey.objects.all().delete()
            _waiting_rows(ORDERED_CONSUMER, size)
            _store_plain(f"p{run}-{size}", count)
            vacuum()
            worker = Worker(
                consumers=[ORDERED_CONSUMER, CONSUMER], until_idle=0, poll_interval=0.01
            )
            with (
                override_settings(INBOX_CONSUMERS=_policy(ORDERED_CONSUMER)),
                measuring(series[size], count, backend),
            ):
                stats = worker.run()
            if stats.outcomes.get("processed") != count:
                raise RuntimeError(f"drained {dict(stats.outcomes)} of {count}")
            if run == 0:
                sweeps[size] = _sweep_ms(ORDERED_CONSUMER)
        log(
            "   run "
            + f"{run + 1}: "
            + ", ".join(f"{size:,} waiting {series[size].rates[-1]:,.0f}/s" for size in SIZES)
        )
    truncate_inbox()
    base = series[0].median
    result: dict[str, Any] = {"count": count, "keys": KEYS, "target_ratio": 0.9, "sizes": {}}
    for size in SIZES:
        ratio = series[size].median / base if base else 0.0
        result["sizes"][str(size)] = {
            **series[size].as_dict(),
            "ratio_to_none": round(ratio, 3),
            "sweep_ms": sweeps.get(size),
        }
        log(
            f"   {size:,} waiting: {series[size].median:,.0f}/s, ratio {ratio:.2f}, "
            f"one gap sweep {sweeps.get(size)} ms"
        )
    return result


def render_waiting(data: dict[str, Any]) -> str:
    """Markdown: the drain beside each number of waiting rows, its ratio and the sweep."""
    lines = ["## Versions waiting behind dead ones, beside a plain consumer", ""]
    if "skipped" in data:
        return "\n".join([*lines, f"Not measured: {data['skipped']}.", ""])
    lines += [
        "| waiting rows | plain drain | ratio to none | target | one gap sweep |",
        "|---:|---:|---:|---:|---:|",
    ]
    for size, figure in data["sizes"].items():
        ratio = figure["ratio_to_none"]
        reached = "" if int(size) == 0 else (" ✓" if ratio >= data["target_ratio"] else " ✗")
        lines.append(
            f"| {int(size):,} | {figure['median']:,.0f} msg/s | {ratio:.2f}{reached} "
            f"| ≥ {data['target_ratio']} | {figure['sweep_ms']} ms |"
        )
    lines += [
        "",
        f"One worker runs the ordered consumer and the plain one; {data['count']:,} plain "
        f"messages drained per run; the waiting rows belong to {data['keys']} keys, each behind "
        "one dead version, dated an hour back, `gap_timeout` 1 s. They have no deadline (made "
        "by `deliver()`, checked), so the sweep never reads them.",
        "",
    ]
    return "\n".join(lines)
