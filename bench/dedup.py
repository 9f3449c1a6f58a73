"""Figures 3 and 4: duplicates rejected by ``deliver()`` against the raw psycopg floor, and
``store()`` of new messages."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable

import psycopg

from bench.config import BENCH_DSN, RUNS, N, log, truncate_inbox, vacuum
from bench.deliver import RawPsycopg
from bench.timing import Series, django_backend_pid, measure, payload


class RawDuplicates:
    """The floor for rejecting a duplicate: raw psycopg, autocommit, the inbox's insert as one
    prepared ``INSERT … ON CONFLICT DO NOTHING RETURNING id`` that returns no row."""

    def __init__(self) -> None:
        self.conn = psycopg.connect(BENCH_DSN, autocommit=True)
        self.cur = self.conn.cursor()
        self.pid = self.conn.info.backend_pid

    def op(self, run: int) -> Callable[[int], None]:
        from bench.inbox_handlers import CONSUMER, EVENT_TYPE

        def op(i: int) -> None:
            now = dt.datetime.now(dt.UTC)
            body = json.dumps(payload(i))
            params = (CONSUMER, f"d{run}-{i % N}", EVENT_TYPE, body, now, now, now)
            self.cur.execute(RawPsycopg.INSERT, params, prepare=True)
            if self.cur.fetchone() is not None:
                raise RuntimeError("raw duplicate insert inserted a row")

        return op

    def close(self) -> None:
        self.conn.close()


# ----------------------------------------------------------------------------- 3. duplicates


def bench_duplicates() -> dict[str, Series]:
    """Re-deliver ids that section 1 completed (``d{run}-0`` … ``d{run}-{N-1}``)."""
    from bench.inbox_handlers import CONSUMER, EVENT_TYPE
    from django_inbox import Outcome, deliver, store

    log(f"\n== 3. duplicate rejection: {RUNS} runs x {N} already-completed ids")
    series = {
        "duplicate_deliver": Series("deliver() of an already-completed id"),
        "duplicate_raw": Series("raw psycopg floor: prepared INSERT … ON CONFLICT, no row"),
        "duplicate_alternating": Series("deliver(), new and duplicate alternating (info)"),
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

    def alternating(run: int) -> Callable[[int], None]:
        """Odd i: a new id; even i: the id before it again. The worst case for the run of
        duplicates: each new message pays the read, each duplicate the insert."""

        previous = [-1]

        def op(i: int) -> None:
            again = i % 2 == 0 and previous[0] == i - 1
            previous[0] = i
            outcome = deliver(
                consumer=CONSUMER,
                message_id=f"alt{run}-{i - 1 if again else i}",
                event_type=EVENT_TYPE,
                payload=payload(i),
            )
            if outcome is not (Outcome.DUPLICATE if again else Outcome.PROCESSED):
                raise RuntimeError(f"alternating deliver() returned {outcome!r}")

        return op

    vacuum()
    pid = django_backend_pid()
    raw = RawDuplicates()
    try:
        for run in range(RUNS):
            # Interleaved, A B A B: deliver(), then its floor, in every run.
            for key, make, backend in (
                ("duplicate_deliver", dup_deliver, pid),
                ("duplicate_raw", raw.op, raw.pid),
                ("duplicate_alternating", alternating, pid),
                ("duplicate_store", dup_store, pid),
            ):
                rate = measure(series[key], make(run), backend)
                log(f"   run {run + 1}: {series[key].name:56s} {rate:8.0f} msg/s")
    finally:
        raw.close()
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
