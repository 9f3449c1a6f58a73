"""A ``transaction.on_commit`` callback that raises after the commit is not the handler's
failure: the message is completed once and reported ``processed``, on every path."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from django.db import transaction
from effects.models import Effect

from django_inbox import Outcome, deliver, store
from django_inbox.intake.batches import deliver_batch
from django_inbox.intake.rows import prepare
from django_inbox.models import InboxMessage
from django_inbox.services import process_due
from tests.conftest import handler

pytestmark = pytest.mark.django_db(transaction=True)

CONSUMER = "effects"
EVENT = "commit.hook"


SECRET = "-".join(["callback", "secret"])  # built, so no source line shows it


def _boom() -> None:
    raise RuntimeError(SECRET)


@pytest.fixture
def calls() -> Counter[str]:
    """A handler that writes an effect and registers a failing on_commit callback."""
    seen: Counter[str] = Counter()

    def write_then_hook(message: InboxMessage) -> None:
        seen[message.message_id] += 1
        Effect.objects.create(
            consumer=CONSUMER, message_id=message.message_id, attempt=message.attempts, pid=0
        )
        transaction.on_commit(_boom)

    with handler(EVENT, CONSUMER, write_then_hook):
        yield seen


def _effects() -> Counter[str]:
    return Counter(Effect.objects.filter(consumer=CONSUMER).values_list("message_id", flat=True))


def test_deliver_reports_processed_not_a_duplicate(
    calls: Counter[str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="django_inbox")
    outcome = deliver(consumer=CONSUMER, message_id="hook-1", event_type=EVENT, payload={})
    assert outcome == Outcome.PROCESSED
    row = InboxMessage.objects.get(message_id="hook-1")
    assert (row.status, row.attempts, row.errors) == ("completed", 1, [])
    assert _effects() == {"hook-1": 1} and calls == {"hook-1": 1}
    assert any("on_commit callback raised" in r.getMessage() for r in caplog.records)
    assert not any(SECRET in r.getMessage() for r in caplog.records)
    again = deliver(consumer=CONSUMER, message_id="hook-1", event_type=EVENT, payload={})
    assert again == Outcome.DUPLICATE


def test_a_worker_reports_processed(calls: Counter[str]) -> None:
    for n in range(3):
        store(consumer=CONSUMER, message_id=f"hook-w{n}", event_type=EVENT, payload={})
    stats = process_due([CONSUMER], max_messages=None)
    assert stats.outcomes == {"processed": 3}
    assert set(InboxMessage.objects.values_list("status", flat=True)) == {"completed"}
    assert _effects() == {f"hook-w{n}": 1 for n in range(3)}
    assert calls == {f"hook-w{n}": 1 for n in range(3)}


def test_a_shared_transaction_batch_does_not_run_its_handlers_again(calls: Counter[str]) -> None:
    for n in range(5):
        store(consumer=CONSUMER, message_id=f"hook-b{n}", event_type=EVENT, payload={})
    stats = process_due([CONSUMER], max_messages=None, commit_every=5)
    assert stats.outcomes == {"processed": 5}
    assert calls == {f"hook-b{n}": 1 for n in range(5)}, "handlers ran twice"
    assert _effects() == {f"hook-b{n}": 1 for n in range(5)}


def test_deliver_batch_does_not_run_its_handlers_again(calls: Counter[str]) -> None:
    rows = [
        prepare(consumer=CONSUMER, message_id=f"hook-d{n}", event_type=EVENT, payload={})
        for n in range(4)
    ]
    assert deliver_batch(rows) == [Outcome.PROCESSED] * 4
    assert calls == {f"hook-d{n}": 1 for n in range(4)}, "handlers ran twice"
    assert _effects() == {f"hook-d{n}": 1 for n in range(4)}
