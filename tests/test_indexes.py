"""The worker's polling query and the dedup lookup can use their indexes.

With sequential scans disabled the planner picks an index whenever one applies, so these
plans show the index is usable at any size (bench/ shows the plans on millions of rows).
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_inbox.models import InboxMessage

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def plan(queryset) -> str:  # type: ignore[no-untyped-def]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        return str(queryset.explain())


def test_claim_query_is_an_ordered_scan_of_the_partial_index() -> None:
    claim = (
        InboxMessage.objects.due(timezone.now())
        .filter(consumer="inventory")
        .order_by("next_attempt_at", "pk")
        .select_for_update(skip_locked=True)[:100]
    )
    text = plan(claim)
    assert "django_inbox_polled_idx" in text, text
    assert "Sort" not in text, text


def test_dedup_lookup_uses_the_unique_constraint() -> None:
    text = plan(InboxMessage.objects.filter(consumer="inventory", message_id="evt-1"))
    assert "django_inbox_unique_consumer_message" in text, text


def test_fresh_claim_subquery_is_an_ordered_scan_of_the_partial_index() -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute(
            "EXPLAIN SELECT id FROM django_inbox_inboxmessage WHERE consumer = %s "
            "AND status IN (%s, %s) AND next_attempt_at <= now() "
            "ORDER BY next_attempt_at, id LIMIT 100 FOR UPDATE SKIP LOCKED",
            ["inventory", "received", "failed"],
        )
        text = "\n".join(line for (line,) in cursor.fetchall())
    assert "django_inbox_polled_idx" in text, text
    assert "Sort" not in text, text
