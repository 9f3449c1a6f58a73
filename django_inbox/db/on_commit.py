"""A connection's pending ``transaction.on_commit`` callbacks, read in one place.

Django 4.2 to 5.2 keep them in ``connection.run_on_commit``, a list of ``(savepoint ids,
callback, robust)`` tuples. That list is not public API: every reader here gives ``None`` for
another shape, and its callers then do without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connections


def pending(using: str) -> list[Any] | None:
    """The connection's list of pending callbacks (the list itself: entries may be replaced in
    place), or ``None`` if this Django keeps them otherwise."""
    found = getattr(connections[using], "run_on_commit", None)
    return found if isinstance(found, list) else None


def callback_of(entry: Any) -> Callable[[], Any] | None:
    """The callback of one entry of :func:`pending`, or ``None`` for an unknown shape."""
    if isinstance(entry, tuple) and len(entry) == 3 and callable(entry[1]):
        return entry[1]  # type: ignore[no-any-return]
    return None
