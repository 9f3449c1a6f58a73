"""``django_inbox.services.rerun``: a forced re-run of an ordered consumer's completed
versions rebuilds each key in order from its first selected version, skips again what an
operator skipped, and follows ``allow_replay_completed``. (Moved from ``test_reruns.py``,
assertions unchanged; re-runs under every operator action are in
``test_ordered_operator_actions.py``.)"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings
from effects import inbox_handlers
from effects.models import Projection

from django_inbox.models import InboxKey, InboxMessage
from django_inbox.services import operator, select, skipping
from tests.ordered import drain, sent_cleared  # noqa: F401  (autouse)
from tests.unit.test_side_effects import ACTOR, projection, version

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


def test_an_ordered_key_reruns_from_its_first_selected_version_in_order() -> None:
    for sequence in range(1, 7):
        version("A", sequence, sequence * 7)
        version("B", sequence, sequence * 3)
    drain("projection")
    first_a, first_b = projection("A"), projection("B")
    assert first_a[1] == 6 and first_b[1] == 6
    inbox_handlers.SENT.clear()

    # Select versions 1 and 3 of A only: the key re-runs from 1, and 2 … 6 with it.
    result = operator.replay(
        select(consumer="projection", message_ids=["A-1", "A-3"], statuses=["completed"]),
        force=True, **ACTOR,
    )  # fmt: skip
    assert result.changed == {"completed": 6}
    assert any("4 later completed version(s) re-run too" in said for said in result.notes)
    assert InboxKey.objects.get(consumer="projection", key="A").applied_sequence == 0
    statuses = dict(
        InboxMessage.objects.filter(key="A").values_list("sequence", "status").order_by("sequence")
    )
    assert statuses == {1: "received", **{n: "waiting" for n in range(2, 7)}}
    # A new version arriving meanwhile waits for the re-run to catch up.
    version("A", 7, 49)
    drain("projection")
    value, last, reruns = projection("A")
    assert (last, reruns) == (7, 6)
    assert projection("B") == first_b  # other keys untouched
    # The same value as a fresh fold of 1 … 7 in order.
    expected = 0
    for sequence in range(1, 8):
        expected = (expected * 31 + sequence * 7) % inbox_handlers.MODULUS
    assert value == expected
    # Side effects: suppressed for the six re-runs, made for the new version.
    assert inbox_handlers.SENT == ["A-7"]
    assert all(row.is_rerun for row in InboxMessage.objects.filter(key="A", sequence__lte=6))


def test_an_operator_skip_is_skipped_again_and_a_dry_run_changes_nothing(capsys: Any) -> None:
    version("A", 1, 1)
    version("A", 2, 2)
    version("A", 3, 3)
    row = InboxMessage.objects.get(message_id="A-2")
    row.payload = {"n": 2, "reject": "a broken version"}
    row.save(update_fields=["payload"])
    drain("projection")
    assert InboxMessage.objects.get(message_id="A-2").status == Status.DEAD
    skipping.skip(select(message_ids=["A-2"]), **ACTOR)
    drain("projection")
    assert projection("A")[1] == 3

    call_command(
        "inbox_replay", "--consumer", "projection", "--key", "A", "--status", "completed",
        "--force", "--reason", "rebuild", "--dry-run", "--no-input",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "would replay 3 row(s) (completed 2, skipped 1)" in out
    assert "1 skipped version(s) skipped again" in out
    assert InboxMessage.objects.filter(key="A", status=Status.COMPLETED).count() == 2

    Projection.objects.all().delete()
    call_command(
        "inbox_replay", "--consumer", "projection", "--key", "A", "--status", "completed",
        "--force", "--reason", "rebuild", "--no-input",
    )  # fmt: skip
    drain("projection")
    statuses = dict(InboxMessage.objects.filter(key="A").values_list("sequence", "status"))
    assert statuses == {1: "completed", 2: "skipped", 3: "completed"}
    assert projection("A")[1] == 3  # 1, then 3 after the skipped 2
    assert InboxKey.objects.get(consumer="projection", key="A").applied_sequence == 3


def test_ordered_reruns_follow_allow_replay_completed() -> None:
    version("A", 1, 1)
    drain("projection")
    consumers = {"projection": {"ordered": True, "allow_replay_completed": False}}
    with override_settings(INBOX_CONSUMERS=consumers):
        result = operator.replay(
            select(consumer="projection", statuses=["completed"]), force=True, **ACTOR
        )
    assert result.total == 0
    assert result.refused == {
        "completed, and consumer 'projection' sets allow_replay_completed=False": 1
    }
    result = operator.replay(select(consumer="projection", statuses=["completed"]), **ACTOR)
    assert result.total == 0 and sum(result.refused.values()) == 1
