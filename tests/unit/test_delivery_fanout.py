"""Two consumers of one event type each run once; deduplication is per consumer."""

from __future__ import annotations

import pytest

from django_inbox import Outcome, deliver
from tests.effects import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)


def test_fan_out_runs_each_consumer_once() -> None:
    def send(consumer: str) -> Outcome:
        return deliver(consumer=consumer, message_id="evt-1", event_type="effect.write", payload={})

    assert send("effects") == Outcome.PROCESSED
    assert send("effects") == Outcome.DUPLICATE
    # The first consumer's duplicate does not suppress the second consumer.
    assert send("audit") == Outcome.PROCESSED
    assert send("audit") == Outcome.DUPLICATE

    assert effect_counts("effects") == {"evt-1": 1}
    assert effect_counts("audit") == {"evt-1": 1}
