"""commit_every > 1: several messages per transaction, with the same exactly-once result.

The parts that run real processes; the rest is in ``tests/unit/test_commit_every.py``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from django_inbox.models import InboxMessage
from tests.conftest import restart_until_it_survives
from tests.effects import lost_and_doubled
from tests.unit.test_commit_every import (
    Status,
    store_effects,
)


@pytest.mark.server_db
@pytest.mark.slow
def test_poison_in_a_shared_transaction_goes_dead_and_spares_the_rest(
    manage: Callable[..., subprocess.Popen[str]],
) -> None:
    ids = [f"m-{n:02d}" for n in range(12)]
    store_effects(ids, m_05={"kill": "always"})

    kills = restart_until_it_survives(
        lambda: manage(
            "inbox_process", "--consumer", "effects", "--commit-every", "10", "--until-idle", "4"
        ),
        bound=12,
    )

    poison = InboxMessage.objects.get(message_id="m-05")
    print(f"shared-transaction poison: kills={kills} attempts={poison.attempts}")
    # The shared transaction's death blames nobody; the next runs, one transaction each,
    # count the poison's three attempts.
    assert kills == 4
    assert (poison.status, poison.attempts) == (Status.DEAD, 3)
    others = InboxMessage.objects.exclude(message_id="m-05")
    assert set(others.values_list("status", flat=True)) == {Status.COMPLETED}
    assert set(others.values_list("attempts", flat=True)) == {1}
    lost, doubled = lost_and_doubled(set(ids) - {"m-05"})
    assert (lost, doubled) == (0, 0)
