"""What the inbox remembers per process is forgotten between tests: a test that left a
remembered takeover check, a cached answer about the pair's constraint or a noted interruption
behind changed what the next test saw (a worker that skipped looking for expired leases, an
insert built for an index a test had dropped). The two tests run in this order: the first
leaves memory behind, the second finds none (it failed before the suite forgot it)."""

from __future__ import annotations

import pytest

from django_inbox.db.statements import common
from django_inbox.models import InboxMessage
from django_inbox.processing import claims, interruptions

pytestmark = pytest.mark.django_db


def test_a_test_that_leaves_process_memory_behind() -> None:
    claims._takeover_checked[("default", "effects")] = 1e12
    common._pair_constraint["default"] = False
    row = InboxMessage(pk=1, consumer="effects", message_id="m", lease_id="x")
    interruptions.note([row], using="default", running=None, error=RuntimeError("lost"))
    assert interruptions._noted


def test_the_next_test_starts_with_none() -> None:
    assert claims._takeover_checked == {}
    assert common._pair_constraint == {}
    assert interruptions._noted == []
