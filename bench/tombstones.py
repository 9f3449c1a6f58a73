"""Figure 13: what tombstones cost. ``inbox_purge``'s rate over the same completed rows with
tombstones off (``INBOX_TOMBSTONE_RETENTION = None``) and on, the bytes each tombstone takes,
and ``deliver()`` of new messages with the tombstone table empty and holding every purged id
(the trigger's look at it on the hot path).

Each run loads ``BENCH_TOMBSTONE_ROWS`` completed rows (set-based SQL, as figure 6 does) past
their retention and purges them with ``purge()`` in batches of 5,000; the runs alternate off
and on. ``./scripts/bench tombstones`` writes ``bench/results/tombstones.md`` and ``.json``.
"""

from __future__ import annotations

import time
import uuid
from statistics import median
from typing import Any

from bench.config import RUNS, N, _env_int, bench_sql, log, truncate_inbox
from bench.scale import load_rows
from bench.timing import Series, django_backend_pid, measure, payload

ROWS = _env_int("BENCH_TOMBSTONE_ROWS", 200_000)
BATCH = 5_000
STONES = "django_inbox_inboxtombstone"
INBOX = "django_inbox_inboxmessage"
TRIGGER = "django_inbox_late_copy"


def _purge_rate(keep: bool) -> tuple[float, int]:
    """Load ``ROWS`` old completed rows, purge them; rows/s and tombstones written."""
    from django.test import override_settings

    from django_inbox.services.purge import purge

    truncate_inbox()
    bench_sql(f"TRUNCATE {STONES}")
    # Rows received 40+ days ago: past the default 30-day retention.
    load_rows(0, ROWS, ROWS + 40 * 86400 * 100)
    bench_sql("VACUUM (ANALYZE) django_inbox_inboxmessage")
    retention = 30 * 86400.0 if keep else None
    with override_settings(INBOX_TOMBSTONE_RETENTION=retention):
        began = time.perf_counter()
        result = purge(batch_size=BATCH)
        wall = time.perf_counter() - began
    if result.deleted.get("completed") != ROWS:
        raise RuntimeError(f"purged {result.deleted} of {ROWS} rows")
    return ROWS / wall, result.tombstones_written


def _stone_bytes() -> dict[str, float]:
    bench_sql(f"VACUUM (ANALYZE) {STONES}")
    count, heap, total = bench_sql(
        f"SELECT count(*), pg_relation_size('{STONES}'), pg_total_relation_size('{STONES}') "
        f"FROM {STONES}"
    )[0]
    return {
        "tombstones": int(count),
        "heap_bytes_per_tombstone": round(heap / max(count, 1), 1),
        "total_bytes_per_tombstone": round(total / max(count, 1), 1),
    }


def _new_deliveries(labels: list[str], before_run: Any = None) -> list[dict[str, Any]]:
    """``deliver()`` of new ids (none has a tombstone), one series per label, their runs
    interleaved in alternating order (``before_run(label)`` sets each one up)."""
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import Outcome, deliver

    series = [Series(f"deliver() of a new message, {label}") for label in labels]

    def op(i: int) -> None:
        outcome = deliver(
            consumer=CONSUMER,
            message_id=str(uuid.uuid4()),
            event_type=EVENT_TYPE,
            payload=payload(i),
        )
        if outcome is not Outcome.PROCESSED:
            raise RuntimeError(f"new deliver() returned {outcome!r}")

    pid = django_backend_pid()
    for run in range(RUNS):
        order = list(range(len(labels)))
        for k in order if run % 2 == 0 else order[::-1]:
            if before_run is not None:
                before_run(labels[k])
            rate = measure(series[k], op, pid)
            log(f"   run {run + 1}: {series[k].name:56s} {rate:8.0f} msg/s")
    return [one.as_dict() for one in series]


def _trigger(label: str) -> None:
    state = "DISABLE" if label == "no trigger" else "ENABLE"
    bench_sql(f"ALTER TABLE {INBOX} {state} TRIGGER {TRIGGER}")


def bench_tombstones() -> dict[str, Any]:
    log(f"\n== tombstones: purge of {ROWS:,} completed rows, off and on, {RUNS} runs each")
    off: list[float] = []
    on: list[float] = []
    written = 0
    try:
        for run in range(RUNS):
            for keep in (False, True) if run % 2 == 0 else (True, False):
                rate, stones = _purge_rate(keep)
                (on if keep else off).append(rate)
                written = stones if keep else written
                state = "on " if keep else "off"
                log(f"   run {run + 1}: purge, tombstones {state} {rate:10,.0f} rows/s")
        truncate_inbox()
        storage = _stone_bytes()
        (full,) = _new_deliveries([f"{storage['tombstones']:,} tombstones"])
        bench_sql(f"TRUNCATE {STONES}")
        # The trigger's own cost: the same deliveries with it enabled and disabled, in
        # alternating runs (enabled again at the end).
        try:
            empty, bare = _new_deliveries(["no tombstones", "no trigger"], _trigger)
        finally:
            _trigger("trigger")
    finally:
        truncate_inbox()
        bench_sql(f"TRUNCATE {STONES}")
    return {
        "rows": ROWS,
        "batch": BATCH,
        "purge_rows_per_s_off": [round(r) for r in off],
        "purge_rows_per_s_on": [round(r) for r in on],
        "purge_median_off": round(median(off)),
        "purge_median_on": round(median(on)),
        "purge_ratio_on_over_off": round(median(on) / median(off), 3),
        "tombstones_written": written,
        **storage,
        "deliver_new_empty": empty,
        "deliver_new_full": full,
        "deliver_ratio_full_over_empty": round(full["median"] / empty["median"], 3),
        "deliver_new_no_trigger": bare,
        "deliver_ratio_trigger_over_none": round(empty["median"] / bare["median"], 3),
        "n": N,
    }


def render_tombstones(data: dict[str, Any]) -> str:
    if "skipped" in data:
        return f"## Figure 13: tombstones\n\nNot measured: {data['skipped']}.\n"
    return "\n".join(
        [
            "## Figure 13: tombstones",
            "",
            "| | tombstones off | tombstones on | on / off |",
            "|---|---:|---:|---:|",
            f"| `purge()` of {data['rows']:,} completed rows, rows/s (median; runs "
            f"{data['purge_rows_per_s_off']} / {data['purge_rows_per_s_on']}) | "
            f"{data['purge_median_off']:,} | {data['purge_median_on']:,} | "
            f"{data['purge_ratio_on_over_off']:.2f} |",
            f"| new `deliver()`, msg/s (median), tombstone table empty / holding "
            f"{data['tombstones']:,} | {data['deliver_new_empty']['median']:,.0f} | "
            f"{data['deliver_new_full']['median']:,.0f} | "
            f"{data['deliver_ratio_full_over_empty']:.2f} |",
            f"| new `deliver()`, msg/s (median), the late-copy trigger disabled / enabled "
            f"(empty table) | {data['deliver_new_no_trigger']['median']:,.0f} | "
            f"{data['deliver_new_empty']['median']:,.0f} | "
            f"{data['deliver_ratio_trigger_over_none']:.2f} |",
            "",
            f"A tombstone takes {data['total_bytes_per_tombstone']:.1f} bytes with its indexes "
            f"({data['heap_bytes_per_tombstone']:.1f} in the heap), against figure 6's ~244 "
            f"bytes for a completed row without payload. Purge batches of {data['batch']:,}.",
            "",
        ]
    )
