"""The worker's polling query and the dedup lookup can use their indexes.

With sequential scans disabled the planner picks an index whenever one applies, so these
plans show the index is usable at any size (bench/ shows the plans on millions of rows).
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_inbox.db import statements
from django_inbox.db.statements.common import identity_params
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


def test_dedup_lookup_uses_the_unique_index_of_identities() -> None:
    # A plain filter by the pair, as users write it, reads the digest index too.
    text = plan(InboxMessage.objects.filter(consumer="inventory", message_id="evt-1"))
    assert "Index Scan using django_inbox_identity_idx" in text, text
    text = plan(InboxMessage.objects.identified(("inventory", "evt-1"), ("billing", "evt-2")))
    assert "django_inbox_identity_idx" in text and "Seq Scan" not in text, text


def generic_plan(sql: str, params: list[object]) -> str:
    """The plan of ``sql`` as a prepared statement under a generic plan (the plan PostgreSQL
    caches for a statement prepared server-side, whatever its parameters)."""
    numbered, count = sql, 0
    while "%s" in numbered:
        count += 1
        numbered = numbered.replace("%s", f"${count}", 1)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute(f"PREPARE inbox_probe AS {numbered}")
        try:
            cursor.execute(f"EXPLAIN EXECUTE inbox_probe({', '.join(['%s'] * count)})", params)
            return "\n".join(line for (line,) in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE inbox_probe")


def test_the_workers_claim_statement_reads_the_partial_index_even_under_a_generic_plan() -> None:
    # The very statement the worker sends (db/statements), with its parameters. Its statuses
    # are literals: as parameters, a generic plan could not use the partial index at all.
    now = timezone.now()
    text = generic_plan(
        statements.claim_fresh_sql("default"),
        ["lease", now, now, now, "inventory", now, 100],
    )
    assert "django_inbox_polled_idx" in text, text
    assert "Sort" not in text, text


def test_a_duplicates_status_lookup_reads_the_unique_index() -> None:
    text = generic_plan(
        statements.current_status_sql("default"), identity_params("inventory", "evt-1")
    )
    assert "Index Scan using django_inbox_identity_idx" in text, text
