"""``@side_effect`` calls from other threads during re-runs: ``carry_run()`` and
``CarryRunExecutor`` carry the handler's run into them; without them the calls run (the trap);
calls after the attempt ended are suppressed and logged, and leave the row alone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from effects import inbox_handlers

from django_inbox import CarryRunExecutor, carry_run, deliver, signals
from django_inbox.models import InboxMessage
from django_inbox.side_effects import current_message
from tests.conftest import handler
from tests.unit.test_side_effects import drain, rerun

pytestmark = pytest.mark.django_db(transaction=True)
RECEIPT = "effects.inbox_handlers.send_receipt"
#: What the carried functions saw: (the message current in the thread, what the call returned).
SEEN: list[tuple[Any, Any]] = []
WAIT = 30  # seconds: a bound on waits between threads, never reached when things work


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    inbox_handlers.SENT.clear()
    SEEN.clear()
    yield
    inbox_handlers.SENT.clear()
    SEEN.clear()


def _send(message_id: str) -> None:
    SEEN.append((current_message(), inbox_handlers.send_receipt(message_id)))


def first_run_and_rerun(event_type: str, func: Any, message_id: str) -> InboxMessage:
    """Deliver ``message_id`` to the suppressing consumer ``notify`` (its side effects run),
    then re-run it; the row after the re-run."""
    with handler(event_type, "notify", func):
        deliver(consumer="notify", message_id=message_id, event_type=event_type, payload={})
        first = list(inbox_handlers.SENT)
        inbox_handlers.SENT.clear()
        rerun("notify", message_id)
        drain("notify")
    row = InboxMessage.objects.get(consumer="notify", message_id=message_id)
    assert row.status == InboxMessage.Status.COMPLETED, row.last_error
    assert first, "the first run made no side effect"
    return row


def suppressed(row: InboxMessage) -> list[tuple[str, int, int]]:
    return [
        (e["function"], e["attempt"], e["calls"]) for e in row.history if e["kind"] == "suppressed"
    ]


# --- carried: suppressed and recorded with the attempt ------------------------------------


def _pool_handler(message: Any) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        pool.submit(carry_run(_send), message.message_id).result()
    thread = threading.Thread(target=carry_run(_send), args=(message.message_id,))
    thread.start()
    thread.join()


def test_a_carried_call_runs_once_on_the_first_run_and_is_suppressed_on_a_rerun() -> None:
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs["extra"])

    signals.side_effect_suppressed.connect(receiver)
    try:
        with handler("effect.pool", "notify", _pool_handler):
            deliver(consumer="notify", message_id="p1", event_type="effect.pool", payload={})
            assert inbox_handlers.SENT == ["p1", "p1"]  # the pool's call and the thread's
            first = InboxMessage.objects.get(message_id="p1")
            assert [(m.pk, result) for m, result in SEEN] == [(first.pk, "sent")] * 2
            inbox_handlers.SENT.clear()
            SEEN.clear()
            rerun("notify", "p1")
            drain("notify")
    finally:
        signals.side_effect_suppressed.disconnect(receiver)
    assert inbox_handlers.SENT == []
    assert [result for _, result in SEEN] == [None, None]
    row = InboxMessage.objects.get(message_id="p1")
    assert row.status == InboxMessage.Status.COMPLETED and row.is_rerun
    assert suppressed(row) == [(RECEIPT, 1, 2)]
    assert heard == [{"function": RECEIPT, "calls": 2}]


def _together(message_id: str, barrier: threading.Barrier) -> None:
    barrier.wait(timeout=WAIT)  # both threads are in the carried function at once
    _send(message_id)


def _map_handler(message: Any) -> None:
    barrier = threading.Barrier(2)
    ids = [f"{message.message_id}-{n}" for n in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(carry_run(_together), ids, [barrier] * 2))


def test_one_carried_function_runs_in_several_threads_at_once() -> None:
    row = first_run_and_rerun("effect.map", _map_handler, "q1")
    assert inbox_handlers.SENT == []
    assert suppressed(row) == [(RECEIPT, 1, 2)]


def _executor_handler(message: Any) -> None:
    with CarryRunExecutor(max_workers=3) as pool:
        pool.submit(inbox_handlers.send_receipt, message.message_id).result()
        list(pool.map(inbox_handlers.send_receipt, [message.message_id] * 5))


def test_the_executor_carries_every_submitted_call() -> None:
    row = first_run_and_rerun("effect.executor", _executor_handler, "e1")
    assert inbox_handlers.SENT == []
    assert suppressed(row) == [(RECEIPT, 1, 6)]


def test_outside_handlers_a_carried_function_just_runs() -> None:
    with CarryRunExecutor(max_workers=1) as pool:
        assert pool.submit(inbox_handlers.send_receipt, "x").result() == "sent"
    assert carry_run(inbox_handlers.send_receipt)("y") == "sent"
    assert inbox_handlers.SENT == ["x", "y"]


# --- not carried: the trap ---------------------------------------------------------------


def _bare_pool_handler(message: Any) -> None:
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(_send, message.message_id).result()


def test_without_carry_run_a_thread_makes_its_side_effect_again_on_a_rerun() -> None:
    row = first_run_and_rerun("effect.bare", _bare_pool_handler, "b1")
    assert inbox_handlers.SENT == ["b1"]  # repeated: the thread did not know of the re-run
    assert SEEN[-1] == (None, "sent")  # nor of the message
    assert suppressed(row) == []


# --- carried, but called after the attempt ended ------------------------------------------

LATE: list[threading.Thread] = []
GO = threading.Event()


def _after_go(message_id: str) -> None:
    assert GO.wait(timeout=WAIT)
    _send(message_id)


def _late_handler(message: Any) -> None:
    thread = threading.Thread(target=carry_run(_after_go), args=(message.message_id,))
    thread.start()
    LATE.append(thread)  # not joined: the handler returns, the attempt commits


def release_late() -> None:
    GO.set()
    for thread in LATE:
        thread.join(timeout=WAIT)
        assert not thread.is_alive()
    LATE.clear()
    GO.clear()


def test_a_call_after_the_attempt_ended_is_suppressed_logged_and_leaves_the_row_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    try:
        with handler("effect.late", "notify", _late_handler):
            deliver(consumer="notify", message_id="l1", event_type="effect.late", payload={})
            release_late()
            assert inbox_handlers.SENT == ["l1"]  # a first run: late or not, it runs
            rerun("notify", "l1")
            drain("notify")
        before = InboxMessage.objects.get(message_id="l1")
        assert before.status == InboxMessage.Status.COMPLETED and before.is_rerun
        with caplog.at_level(logging.INFO, logger="django_inbox"):
            release_late()
    finally:
        release_late()
    assert inbox_handlers.SENT == ["l1"]  # not sent again
    assert SEEN[-1] == (before, None)
    after = InboxMessage.objects.get(message_id="l1")
    assert suppressed(after) == [] and after.history == before.history
    (line,) = [r.getMessage() for r in caplog.records if "side effect" in r.getMessage()]
    assert RECEIPT in line and "after the attempt ended" in line
