"""Storage and duplicate rejection by table size: bytes per row of the inbox table and
``deliver()`` of already-completed ids at 10,000, 1,000,000 and ``BENCH_SCALE_ROWS`` rows.

The rows are bulk-loaded with set-based SQL (``INSERT … SELECT generate_series``, in chunks
of a million), as ``completed`` rows of consumer ``bench`` without payload; their ids are
uuid-like (``md5(i)::uuid``), so the unique index grows by random inserts, as a real one
does. The duplicates are drawn at random (fixed seed) across the whole table, so a large
table's index pages are not all in shared buffers.
"""

from __future__ import annotations

import random
import time
import uuid
from hashlib import md5
from typing import Any

from bench.config import RUNS, N, _env_int, bench_sql, log, truncate_inbox
from bench.timing import Series, django_backend_pid, measure

SCALE_ROWS = _env_int("BENCH_SCALE_ROWS", 10_000_000)
SMALL_ROWS = 10_000
MID_ROWS = 1_000_000
CHUNK = 1_000_000
SEED = 20240611
TABLE = "django_inbox_inboxmessage"
TARGET_COST_RATIO = 1.2  # dedup at the largest size costs at most 1.2 x that at 10k rows
TARGET_BYTES_PER_ROW = 250.0


def message_id(i: int) -> str:
    """Row ``i``'s id, as the SQL loader makes it: ``md5(i::text)::uuid::text``."""
    return str(uuid.UUID(md5(str(i).encode()).hexdigest()))


def load_rows(start: int, stop: int, total: int) -> None:
    """Insert completed rows ``start`` … ``stop - 1``, in chunks of ``CHUNK``; row ``i`` was
    received ``(total - i) x 10 ms`` ago, so ``received_at`` grows with ``id`` (BRIN)."""
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE

    for lo in range(start, stop, CHUNK):
        hi = min(stop, lo + CHUNK)
        began = time.perf_counter()
        bench_sql(
            f"INSERT INTO {TABLE} (consumer, message_id, source, event_type, key, payload, "
            "headers, status, attempts, last_error, history, received_at, updated_at, "
            "next_attempt_at, locked_until, lease_id, processed_at) "
            f"SELECT '{CONSUMER}', md5(i::text)::uuid::text, '', '{EVENT_TYPE}', '', '{{}}', "
            "'{}', 'completed', 1, '', '[]', t, t + interval '5 ms', NULL, NULL, '', "
            "t + interval '5 ms' "
            f"FROM generate_series({lo}, {hi - 1}) AS i, "
            f"LATERAL (SELECT now() - ({total} - i)::float8 * interval '10 ms' AS t) AS at"
        )
        wall = time.perf_counter() - began
        log(f"   loaded rows {lo:>11,} … {hi - 1:>11,}  ({(hi - lo) / wall:8,.0f} rows/s)")


def storage(rows: int) -> dict[str, Any]:
    """Bytes per row of the heap, TOAST, each index and the whole relation."""
    heap, toast, total = bench_sql(
        f"SELECT pg_relation_size('{TABLE}', 'main') + pg_relation_size('{TABLE}', 'fsm') "
        f"+ pg_relation_size('{TABLE}', 'vm'), "
        "COALESCE(pg_total_relation_size(NULLIF(reltoastrelid, 0)), 0), "
        f"pg_total_relation_size('{TABLE}') FROM pg_class WHERE oid = '{TABLE}'::regclass"
    )[0]
    indexes = bench_sql(
        "SELECT c.relname, pg_relation_size(i.indexrelid) FROM pg_index i "
        f"JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = '{TABLE}'::regclass "
        "ORDER BY c.relname"
    )

    def per_row(size: int) -> float:
        return round(size / rows, 1)

    return {
        "rows": rows,
        "total_bytes": int(total),
        "heap_bytes_per_row": per_row(heap),
        "toast_bytes_per_row": per_row(toast),
        "index_bytes_per_row": {name: per_row(size) for name, size in indexes},
        "total_bytes_per_row": per_row(total),
    }


def dedup_rate(rows: int) -> dict[str, Any]:
    """``deliver()`` of ids drawn at random among the ``rows`` completed ones."""
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import Outcome, deliver

    series = Series(f"deliver() of a completed id, {rows:,} rows")
    rng = random.Random(SEED)

    def op(i: int) -> None:
        outcome = deliver(
            consumer=CONSUMER,
            message_id=message_id(rng.randrange(rows)),
            event_type=EVENT_TYPE,
            payload={},
        )
        if outcome is not Outcome.DUPLICATE:
            raise RuntimeError(f"duplicate deliver() returned {outcome!r} at {rows} rows")

    pid = django_backend_pid()
    for run in range(RUNS):
        rate = measure(series, op, pid)
        log(f"   run {run + 1}: {series.name:56s} {rate:8.0f} msg/s")
    return series.as_dict()


def bench_scale() -> dict[str, Any]:
    """Load the inbox table to ``BENCH_SCALE_ROWS`` completed rows; measure its size and
    duplicate rejection on the way. Truncates the table before and after."""
    sizes = sorted({SMALL_ROWS, min(MID_ROWS, SCALE_ROWS), SCALE_ROWS})
    log(
        f"\n== storage and dedup by table size: {', '.join(f'{s:,}' for s in sizes)} rows, "
        f"{RUNS} runs x {N} duplicates each"
    )
    points: list[dict[str, Any]] = []
    began = time.perf_counter()
    loaded = 0
    truncate_inbox()
    try:
        for size in sizes:
            load_rows(loaded, size, SCALE_ROWS)
            loaded = size
            bench_sql(f"VACUUM (ANALYZE) {TABLE}")
            point = {**storage(size), "dedup": dedup_rate(size)}
            log(
                f"   {size:>11,} rows: {point['total_bytes_per_row']:6.1f} bytes/row "
                f"(heap {point['heap_bytes_per_row']}, indexes {point['index_bytes_per_row']})"
            )
            points.append(point)
    finally:
        truncate_inbox()
    small, largest = points[0], points[-1]
    rate_ratio = largest["dedup"]["median"] / small["dedup"]["median"]
    return {
        "rows": SCALE_ROWS,
        "seed": SEED,
        "points": points,
        "dedup_ratio_max_vs_10k": round(rate_ratio, 3),
        "dedup_cost_ratio_max_vs_10k": round(1 / rate_ratio, 3),
        "bytes_per_row_at_max": largest["total_bytes_per_row"],
        "targets": {
            "dedup_cost_ratio_max": TARGET_COST_RATIO,
            "bytes_per_row_max": TARGET_BYTES_PER_ROW,
        },
        "dedup_target_met": 1 / rate_ratio <= TARGET_COST_RATIO,
        "bytes_target_met": largest["total_bytes_per_row"] <= TARGET_BYTES_PER_ROW,
        "seconds": round(time.perf_counter() - began, 1),
    }


def render_scale(data: dict[str, Any]) -> str:
    """Markdown: one column per table size, bytes per row and the duplicate rate."""
    if "skipped" in data:
        return f"## Storage and dedup by table size\n\nNot measured: {data['skipped']}.\n"
    points = data["points"]
    names = sorted({name for p in points for name in p["index_bytes_per_row"]})
    head = "| | " + " | ".join(f"{p['rows']:,} rows" for p in points) + " |"
    lines = ["## Storage and dedup by table size", "", head, "|---" * (len(points) + 1) + "|"]

    def row(label: str, values: list[str]) -> None:
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    row("heap (main + fsm + vm), bytes/row", [f"{p['heap_bytes_per_row']:.1f}" for p in points])
    row("TOAST, bytes/row", [f"{p['toast_bytes_per_row']:.1f}" for p in points])
    for name in names:
        sizes = [f"{p['index_bytes_per_row'].get(name, 0):.1f}" for p in points]
        row(f"`{name}`, bytes/row", sizes)
    row("**total, bytes/row**", [f"**{p['total_bytes_per_row']:.1f}**" for p in points])
    row("total size, MiB", [f"{p['total_bytes'] / 2**20:.1f}" for p in points])
    row(
        "duplicate `deliver()`, msg/s (median)",
        [f"{p['dedup']['median']:,.0f}" for p in points],
    )
    row(
        "duplicate `deliver()`, µs/msg",
        [f"{p['dedup'].get('wall_us_per_msg', 0):.1f}" for p in points],
    )
    targets = data["targets"]
    dedup_ok = "met" if data["dedup_target_met"] else "**missed**"
    bytes_ok = "met" if data["bytes_target_met"] else "**missed**"
    lines += [
        "",
        f"Completed rows without payload, loaded with set-based SQL; uuid-like ids, so the "
        f"unique index grows by random inserts. Duplicates are ids drawn at random (seed "
        f"{data['seed']}) across the whole table.",
        f"Duplicate `deliver()` at {points[-1]['rows']:,} rows costs "
        f"{data['dedup_cost_ratio_max_vs_10k']:.2f}x what it costs at {points[0]['rows']:,} "
        f"(target ≤ {targets['dedup_cost_ratio_max']}: {dedup_ok}); the table takes "
        f"{data['bytes_per_row_at_max']:.1f} bytes/row (target ≤ "
        f"{targets['bytes_per_row_max']:.0f}: {bytes_ok}).",
    ]
    return "\n".join(lines) + "\n"
