"""Figure 2d: an ordered consumer's drain against an unordered one, same handler, same run.

Three drains of the same number of stored messages, interleaved A B C in every run, each by
``Worker.run()`` in this process:

- unordered: the benchmark consumer, messages carrying a key and a sequence it ignores;
- ordered: an ordered consumer (``bench.settings``), 100 keys, each key's versions stored in
  order (what a partitioned stream delivers);
- ordered, pairs swapped: the same, but each key's versions 2k and 2k-1 stored in that order,
  so half of the messages wait once and are released by their predecessor.

The difference between the last two, per released message, is what one waiting-then-released
message costs.
"""

from __future__ import annotations

from bench.config import DRAIN_SMALL, RUNS, log, truncate_inbox, vacuum
from bench.drain import pending_count
from bench.timing import Series, django_backend_pid, measuring, payload

KEYS = 100


def store_versions(consumer: str, prefix: str, count: int, *, swap_pairs: bool) -> None:
    """Store ``count`` messages of ``KEYS`` keys in one transaction; key ``i % KEYS``, sequence
    ``i // KEYS + 1``; with ``swap_pairs`` each key's even version goes before its odd one."""
    from django.db import transaction

    from bench.inbox_handlers import EVENT_TYPE
    from django_inbox import store

    order = list(range(count))
    if swap_pairs:
        for i in range(0, count - KEYS, 2 * KEYS):
            block = order[i : i + 2 * KEYS]
            order[i : i + 2 * KEYS] = block[KEYS:] + block[:KEYS]
    with transaction.atomic():
        for i in order:
            store(
                consumer=consumer, message_id=f"{prefix}-{i}", event_type=EVENT_TYPE,
                payload=payload(i), key=f"k{i % KEYS}", sequence=i // KEYS + 1,
            )  # fmt: skip


def drain(series: Series, consumer: str, count: int, backend: int) -> dict[str, int]:
    from django_inbox.processing.worker import Worker

    worker = Worker(consumers=[consumer], until_idle=0, poll_interval=0.01)
    with measuring(series, count, backend):
        stats = worker.run()
    if stats.outcomes.get("processed") != count or pending_count():
        raise RuntimeError(f"{consumer}: drained {dict(stats.outcomes)} of {count}")
    return dict(stats.outcomes)


def bench_ordered() -> dict[str, Series]:
    from bench.inbox_handlers import CONSUMER, ORDERED_CONSUMER
    from django_inbox.models import InboxKey

    count = DRAIN_SMALL
    log(
        f"\n== 2d. ordered drain ({KEYS} keys) / unordered drain, {count} messages, interleaved "
        f"({RUNS} runs)"
    )
    series = {
        "drain_unordered": Series(f"drain, unordered consumer, {count} msgs (in process)"),
        "drain_ordered": Series(f"drain, ordered consumer, {KEYS} keys in order, {count} msgs"),
        "drain_ordered_swapped": Series(
            f"drain, ordered consumer, {KEYS} keys, pairs swapped (half wait), {count} msgs"
        ),
    }
    backend = django_backend_pid()
    waited: list[int] = []
    for run in range(RUNS):
        for name, consumer, swap in (
            ("drain_unordered", CONSUMER, False),
            ("drain_ordered", ORDERED_CONSUMER, False),
            ("drain_ordered_swapped", ORDERED_CONSUMER, True),
        ):
            truncate_inbox()
            InboxKey.objects.all().delete()
            store_versions(consumer, f"o{run}{name}", count, swap_pairs=swap)
            vacuum()
            outcomes = drain(series[name], consumer, count, backend)
            if swap:
                waited.append(outcomes.get("waiting", 0))
        rates = [f"{s.rates[-1]:6.0f}" for s in series.values()]
        log(f"   run {run + 1}: unordered {rates[0]}, ordered {rates[1]}, swapped {rates[2]} /s")
    truncate_inbox()
    in_order = 1e6 / series["drain_ordered"].median
    swapped = 1e6 / series["drain_ordered_swapped"].median
    released = sorted(waited)[len(waited) // 2] if waited else 0
    if released:
        cost = (swapped - in_order) * count / released
        series["drain_ordered_swapped"].extra["released"] = released
        series["drain_ordered_swapped"].extra["us_per_released"] = round(cost, 1)
        log(f"   one waiting-then-released message costs {cost:,.0f} us more ({released} waited)")
    return series
