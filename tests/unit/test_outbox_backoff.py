"""The outbox's backoff between failed publications: exponential with full jitter, capped,
for any number of attempts (a row failing about 1,026 times raised ``OverflowError`` in the
relay with a large ``INBOX_OUTBOX_MAX_ATTEMPTS``, and the relay died on it after every
restart)."""

from __future__ import annotations

import random

import pytest
from django.test import override_settings

from django_inbox.outbox.rows import backoff
from django_inbox.outbox.settings import outbox_settings


@pytest.mark.parametrize("attempts", [0, 1, 2, 10, 1_025, 1_026, 1_100, 10**6, 2**63])
def test_the_backoff_is_capped_for_any_number_of_attempts(attempts: int) -> None:
    random.seed(attempts)
    delays = [backoff(attempts) for _ in range(50)]
    assert all(0 <= delay <= outbox_settings.backoff_max for delay in delays)


def test_the_backoff_grows_until_its_cap() -> None:
    with override_settings(INBOX_OUTBOX_BACKOFF_BASE=1.0, INBOX_OUTBOX_BACKOFF_MAX=3600.0):
        random.seed(0)
        first = max(backoff(1) for _ in range(200))
        tenth = max(backoff(10) for _ in range(200))
        late = max(backoff(40) for _ in range(200))
    assert first <= 1.0 < tenth <= 512.0 < late <= 3600.0
