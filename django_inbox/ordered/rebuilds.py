"""The end of a re-run (a rebuild) of an ordered key.

A re-run rewinds its key and records where it stood before (``InboxKey.rerun_through``); the
re-run's versions then run again in order. Sequences of that range that no version holds
(the first run passed them: they never arrived, were purged, or only a stale copy came) are
passed again. Once no version the re-run sends remains above the applied sequence, the key
goes on to where it stood before, and the version after that is made due: the re-run is over.
Every function runs under the key's lock, in the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import QuerySet

from .. import clock
from ..db.statements import KeyState
from ..models import InboxKey, InboxMessage
from . import ordering
from .waits import RUNNABLE


def left_to_rerun(
    consumer: str, key: str, state: KeyState, using: str, *, exclude: int | None = None
) -> QuerySet[InboxMessage]:
    """The versions the re-run under way still sends, above the applied sequence."""
    rows = InboxMessage.objects.using(using).filter(
        consumer=consumer,
        key=key,
        rerun=True,
        status__in=RUNNABLE,
        sequence__gt=state.applied,
        sequence__lte=state.through,
    )
    return rows if exclude is None else rows.exclude(pk=exclude)


def finish_rebuild(
    consumer: str,
    key: str,
    state: KeyState,
    now: datetime,
    using: str,
    *,
    exclude: int | None = None,
) -> tuple[KeyState, list[str]]:
    """If a re-run is under way and nothing is left for it to run (``exclude``: the version
    being decided), move the key to where it stood before the re-run and make the next version
    due. Returns the key's state and the message ids made due."""
    if not state.rebuilding:
        return state, []
    if left_to_rerun(consumer, key, state, using, exclude=exclude).exists():
        return state, []
    assert state.through is not None
    released = ordering.advance(consumer, key, state.through, now, using)
    return KeyState(state.through, state.through), released


def after_rerun(message: InboxMessage, using: str) -> list[str]:
    """After a re-run's version was applied (or skipped again) in this transaction: if it was
    the re-run's last, the key goes on to where it stood before. Returns the ids made due."""
    found = (
        InboxKey.objects.using(using)
        .filter(consumer=message.consumer, key=message.key)
        .values_list("applied_sequence", "rerun_through")
        .first()
    )
    if found is None:
        return []
    state = KeyState(*found)
    _, released = finish_rebuild(
        message.consumer, message.key, state, clock.now(), using, exclude=message.pk
    )
    return released
