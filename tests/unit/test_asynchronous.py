"""``adeliver()`` and ``astore()``: the same results and errors as ``deliver()`` and
``store()``, awaited from async code (an event loop of the test's own; the real ASGI server is
in tests/system). Their transaction is the sync call's own, on Django's thread for it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.db import connections
from effects.models import Effect

from django_inbox import InvalidPayload, Outcome, adeliver, astore, deliver
from django_inbox.models import InboxMessage
from tests.effects import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


@pytest.fixture(autouse=True)
def _close_the_sync_threads_connections() -> Iterator[None]:
    """The calls ran on Django's thread for async code's database work, which opened its own
    connection: closed, as a request's end would, so the test database can be dropped."""
    yield
    asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


def message(message_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "consumer": "effects",
        "message_id": message_id,
        "event_type": "effect.write",
        "payload": {},
        **fields,
    }


def test_adeliver_processes_once_and_answers_a_duplicate() -> None:
    async def twice() -> list[Outcome]:
        return [await adeliver(**message("a-1")), await adeliver(**message("a-1"))]

    assert asyncio.run(twice()) == [Outcome.PROCESSED, Outcome.DUPLICATE]
    assert effect_counts() == {"a-1": 1}
    assert deliver(**message("a-1")) == Outcome.DUPLICATE  # one inbox, whichever API


def test_astore_stores_once_for_a_worker() -> None:
    async def twice() -> list[bool]:
        return [await astore(**message("s-1")), await astore(**message("s-1"))]

    assert asyncio.run(twice()) == [True, False]
    row = InboxMessage.objects.get(message_id="s-1")
    assert row.status == Status.RECEIVED
    assert not Effect.objects.exists()


def test_concurrent_awaits_of_the_same_ids_apply_each_effect_once() -> None:
    async def burst() -> list[Outcome]:
        calls = [adeliver(**message(f"c-{n % 10}")) for n in range(50)]
        return await asyncio.gather(*calls)

    outcomes = asyncio.run(burst())
    assert outcomes.count(Outcome.PROCESSED) == 10
    assert set(outcomes) == {Outcome.PROCESSED, Outcome.DUPLICATE}
    assert effect_counts() == {f"c-{n}": 1 for n in range(10)}


def test_bad_input_raises_as_the_sync_call_does() -> None:
    with pytest.raises(InvalidPayload):
        asyncio.run(adeliver(**message("bad", payload={"x": object()})))
    with pytest.raises(InvalidPayload):
        asyncio.run(astore(**message("bad", payload={"x": float("nan")})))
    assert not InboxMessage.objects.exists()


def test_a_handlers_failure_is_recorded_as_with_deliver() -> None:
    outcome = asyncio.run(adeliver(**message("f-1", payload={"fail_always": True})))
    assert outcome == Outcome.FAILED
    row = InboxMessage.objects.get(message_id="f-1")
    assert (row.status, row.attempts) == (Status.FAILED, 1)


def test_a_cancelled_caller_stops_waiting_not_the_work() -> None:
    """The client went away mid-request: its message is still processed and committed once,
    and the resend it will make is a duplicate."""

    async def cancelled() -> None:
        task = asyncio.create_task(adeliver(**message("x-1", payload={"sleep": 0.5})))
        await asyncio.sleep(0.1)  # inside the handler by now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    # The thread runs one call at a time: the next one returns once the cancelled one is done.
    asyncio.run(sync_to_async(lambda: None, thread_sensitive=True)())
    assert InboxMessage.objects.get(message_id="x-1").status == Status.COMPLETED
    assert effect_counts() == {"x-1": 1}
    assert asyncio.run(adeliver(**message("x-1"))) == Outcome.DUPLICATE
