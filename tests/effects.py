"""Counting effects: the evidence every crash test ends with."""

from __future__ import annotations

from django.db.models import Count
from effects.models import Effect


def effect_counts(consumer: str = "effects") -> dict[str, int]:
    """Committed effects per message id for ``consumer``."""
    rows = Effect.objects.filter(consumer=consumer).values("message_id").annotate(n=Count("id"))
    return {row["message_id"]: row["n"] for row in rows}


def lost_and_doubled(expected: set[str], consumer: str = "effects") -> tuple[int, int]:
    counts = effect_counts(consumer)
    lost = sum(1 for mid in expected if counts.get(mid, 0) == 0)
    doubled = sum(1 for n in counts.values() if n > 1)
    return lost, doubled
