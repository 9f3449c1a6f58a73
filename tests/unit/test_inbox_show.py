"""``inbox_show``: one message's state and history, payloads only when asked."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_inbox import Outcome, deliver
from django_inbox.models import InboxMessage
from django_inbox.ordered.gaps import park_expired_gaps
from django_inbox.services import replay, select
from tests.unit.test_ordering import ordered_policy, send

pytestmark = pytest.mark.django_db(transaction=True)


def show(*args: str) -> str:
    out = StringIO()
    call_command("inbox_show", *args, stdout=out)
    return out.getvalue()


def test_shows_status_attempts_and_history_but_not_the_payload() -> None:
    payload = {"secret": "card-4242", "reject": "sku unknown"}
    assert (
        deliver(consumer="effects", message_id="s-1", event_type="effect.write", payload=payload)
        == Outcome.DEAD
    )
    replay(select(message_ids=["s-1"]), actor="alice", reason="sku added")
    text = show("s-1")
    row = InboxMessage.objects.get(message_id="s-1")
    assert f"effects s-1 (id {row.pk}): received, 0 attempts" in text
    assert "attempt 1 -> dead" in text and "Reject: sku unknown" in text
    assert "replay by alice via python (was dead): sku added" in text
    assert "card-4242" not in text
    assert "card-4242" in show("s-1", "--payload")


def test_json_lists_every_consumer_of_a_message_id() -> None:
    for consumer in ("effects", "audit"):
        deliver(consumer=consumer, message_id="s-2", event_type="effect.write", payload={"n": 1})
    data = json.loads(show("s-2", "--json"))
    assert [(d["consumer"], d["status"]) for d in data] == [
        ("audit", "completed"),
        ("effects", "completed"),
    ]
    assert all("payload" not in d for d in data)
    only = json.loads(show("s-2", "--json", "--consumer", "audit", "--payload"))
    assert [(d["consumer"], d["payload"]) for d in only] == [("audit", {"n": 1})]
    pk = only[0]["id"]
    assert json.loads(show("--id", str(pk), "--json"))[0]["message_id"] == "s-2"


def test_exit_codes() -> None:
    with pytest.raises(CommandError) as info:
        show("nothing-here")
    assert info.value.returncode == 1
    with pytest.raises(CommandError) as info:
        show()
    assert info.value.returncode == 2


def test_an_ordered_row_shows_its_key_sequence_and_gap_once() -> None:
    with ordered_policy(gap_timeout=0.05):
        assert send("K", 1) == Outcome.PROCESSED
        assert send("K", 3) == Outcome.WAITING
        time.sleep(0.1)
        assert park_expired_gaps() == 1

    first, parked = show("K-1"), show("K-3")

    assert first.splitlines()[0].endswith(": completed, 1 attempt")
    assert "   key K   sequence 1" in first
    assert "   key K   sequence 3" in parked
    history = parked.split("  last error  ", 1)[1].splitlines()[1:]
    (gap,) = [line for line in history if "is missing sequence 2" in line]
    assert "  gap: key 'K' is missing sequence 2 (applied: 1; this is 3)" in gap
    assert "gap: gap:" not in parked
    assert json.loads(show("K-3", "--json"))[0]["sequence"] == 3
