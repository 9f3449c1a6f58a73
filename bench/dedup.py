"""Figures 3 and 4: duplicates rejected by ``deliver()``, and ``store()`` of new messages."""

from __future__ import annotations

from collections.abc import Callable

from bench.config import RUNS, N, log, truncate_inbox, vacuum
from bench.timing import Series, django_backend_pid, measure, payload

# ----------------------------------------------------------------------------- 3. duplicates


def bench_duplicates() -> dict[str, Series]:
    """Re-deliver ids that section 1 completed (``d{run}-0`` … ``d{run}-{N-1}``)."""
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import Outcome, deliver, store

    log(f"\n== 3. duplicate rejection: {RUNS} runs x {N} already-completed ids")
    series = {
        "duplicate_deliver": Series("deliver() of an already-completed id"),
        "duplicate_store": Series("store() of an already-stored id (info)"),
    }

    def dup_deliver(run: int) -> Callable[[int], None]:
        def op(i: int) -> None:
            outcome = deliver(
                consumer=CONSUMER,
                message_id=f"d{run}-{i % N}",
                event_type=EVENT_TYPE,
                payload=payload(i),
            )
            if outcome is not Outcome.DUPLICATE:
                raise RuntimeError(f"duplicate deliver() returned {outcome!r}")

        return op

    def dup_store(run: int) -> Callable[[int], None]:
        def op(i: int) -> None:
            if store(
                consumer=CONSUMER,
                message_id=f"d{run}-{i % N}",
                event_type=EVENT_TYPE,
                payload=payload(i),
            ):
                raise RuntimeError("duplicate store() stored a row")

        return op

    vacuum()
    pid = django_backend_pid()
    for run in range(RUNS):
        for key, make in (("duplicate_deliver", dup_deliver), ("duplicate_store", dup_store)):
            rate = measure(series[key], make(run), pid)
            log(f"   run {run + 1}: {series[key].name:56s} {rate:8.0f} msg/s")
    return series


# ----------------------------------------------------------------------------- 4. store


def store_op(prefix: str, *, noop: bool = False) -> Callable[[int], None]:
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE, NOOP_CONSUMER, NOOP_EVENT_TYPE
    from django_inbox import store

    consumer, event_type = (NOOP_CONSUMER, NOOP_EVENT_TYPE) if noop else (CONSUMER, EVENT_TYPE)

    def op(i: int) -> None:
        if not store(
            consumer=consumer, message_id=f"{prefix}-{i}", event_type=event_type, payload=payload(i)
        ):
            raise RuntimeError("store() found a duplicate of a new id")

    return op


def bench_store() -> dict[str, Series]:
    log(f"\n== 4. store() of new messages, one transaction each: {RUNS} runs x {N}")
    series = Series("store(), one transaction per message")
    pid = django_backend_pid()
    for run in range(RUNS):
        truncate_inbox()
        rate = measure(series, store_op(f"s{run}"), pid)
        log(f"   run {run + 1}: {series.name:56s} {rate:8.0f} msg/s")
    truncate_inbox()
    return {"store_single": series}
