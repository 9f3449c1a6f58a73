"""Ordered consumers: a key's messages one at a time, in ascending ``sequence``.

A consumer with ``"ordered": True`` in ``INBOX_CONSUMERS`` keeps, per ``(consumer, key)``, the
last applied sequence in :class:`~django_inbox.models.InboxKey`. Every decision about a keyed
message of such a consumer is taken in a transaction that holds that row's lock
(``SELECT … FOR UPDATE``; on SQLite the write lock of the whole database):

- ``sequence <= applied``: stale. The handler does not run; the row is ``skipped``.
- ``sequence == applied + 1``: the handler runs; ``applied`` becomes ``sequence`` in the
  handler's transaction, and the key's next version, if it waits, is made due (``received``).
- ``sequence > applied + 1``: a gap (or an earlier version still failing). The row is
  ``waiting``, with its gap deadline in ``next_attempt_at``; it runs once its predecessor is
  applied. Past the deadline with no version for the missing sequence that can still run, it
  is ``parked`` (:func:`django_inbox.ordered.gaps.park_expired_gaps`); a replay of it then runs it
  past the gap (:func:`django_inbox.ordered.gaps.jump_gap`).
- no ``sequence``: the handler runs, one at a time with the key's other messages; ``applied``
  does not move.

Because the decision and the release of the next version both happen under the key's lock,
no version can be left waiting by a race: whichever transaction commits second sees the
other's work. Keys never wait for each other. Unordered consumers and messages without a key
never reach this module.
"""

from __future__ import annotations

import logging
from datetime import datetime
from enum import StrEnum
from typing import Any

from ..conf import inbox_settings
from ..db import statements
from ..db.statements import KeyState
from ..families import family
from ..models import InboxMessage
from ..processing import leases

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status


class Verdict(StrEnum):
    RUN = "run"
    SKIP = "skip"
    WAIT = "wait"
    #: Another transaction holds the key (a worker that must not block gives the row back).
    BUSY = "busy"


def applies(consumer: str, key: str) -> bool:
    """Whether a message of ``consumer`` with ``key`` is ordered (cheap: the hot path asks)."""
    return bool(key) and inbox_settings.ordered(consumer)


def lock(consumer: str, key: str, using: str, *, wait: bool = True) -> KeyState | None:
    """Lock ``key``'s row for the caller's transaction and return its state (``first_sequence
    - 1`` applied for a new key); ``None`` if another transaction holds it and ``wait`` is
    false."""
    first = inbox_settings.policy(consumer).first_sequence
    return family(using).lock_key(consumer, key, first, using, wait=wait)


def lock_for_worker(message: InboxMessage, using: str) -> statements.Taken:
    """A worker's lock of a claimed version's key, never waiting, as a
    :class:`~django_inbox.db.statements.Taken`: the key's state (``None``: another
    transaction holds it) and whether this version was recorded applied already (on
    PostgreSQL, completed with it: see :meth:`django_inbox.families.PostgreSQL.lock_for_worker`)."""
    first = inbox_settings.policy(message.consumer).first_sequence
    return family(using).lock_for_worker(message, first, using)


def decide(sequence: int | None, state: KeyState | None, *, rerun: bool) -> Verdict:
    """Run, skip or wait a version (``rerun``: one a re-run sends again) of a key in
    ``state``. While a re-run is under way, other versions up to where it rewound the key from
    are stale, and later ones wait for it: what the key applied before the re-run counts."""
    if state is None:
        return Verdict.BUSY
    if sequence is None:
        return Verdict.RUN
    if state.rebuilding and not rerun:
        assert state.through is not None
        return Verdict.SKIP if sequence <= state.through else Verdict.WAIT
    if sequence == state.applied + 1:
        return Verdict.RUN
    return Verdict.SKIP if sequence <= state.applied else Verdict.WAIT


def stale_reason(key: str, sequence: int, state: KeyState, *, rerun: bool = False) -> str:
    if state.rebuilding and not rerun:
        return (
            f"stale: key {key!r} had applied sequence {state.through} before a re-run (now "
            f"re-applying it, at {state.applied}); this is {sequence}"
        )
    return f"stale: key {key!r} has already applied sequence {state.applied}; this is {sequence}"


def waiting_reason(key: str, sequence: int, state: KeyState, *, rerun: bool = False) -> str:
    if state.rebuilding and not rerun:
        return (
            f"waits for the re-run of key {key!r} to reach sequence {state.through} (at "
            f"{state.applied}); this is {sequence}"
        )
    applied = state.applied
    return (
        f"waits for sequence {applied + 1} of key {key!r} (applied: {applied}); this is {sequence}"
    )


def advance(consumer: str, key: str, sequence: int, now: datetime, using: str) -> list[str]:
    """In the run's transaction: ``key`` has applied ``sequence``; make the next version due.
    Returns the message ids made due."""
    return family(using).advance(consumer, key, sequence, now, using)


def complete(
    message: InboxMessage, now: datetime, using: str, *, applied: bool = False
) -> tuple[bool, list[str]]:
    """The fenced completion of a claimed version of ``message.key``, with the key's new
    applied sequence (unless ``applied``: its lock recorded it) and the release of the next
    version. Returns whether the lease still held the row, and the message ids made due."""
    assert message.sequence is not None
    if applied:
        return family(using).complete_applied(message, now, using)
    if not leases.complete(message, now, using):
        return False, []
    return True, advance(message.consumer, message.key, message.sequence, now, using)


def set_aside(
    message: InboxMessage,
    status: str,
    next_attempt_at: datetime | None,
    last_error: str,
    now: datetime,
    using: str,
) -> bool:
    """A claimed version that does not run now: ``waiting`` (until ``next_attempt_at``, its
    gap deadline) or ``skipped``, its claim's attempt taken back; fenced on its lease."""
    return family(using).set_aside(message, status, next_attempt_at, last_error, now, using)


def release_next(consumer: str, key: str, sequence: int, now: datetime, using: str) -> list[str]:
    """Make ``key``'s waiting rows of ``sequence`` due now (under the key's lock)."""
    return family(using).release_next(consumer, key, sequence, now, using)


def skip_entry(message: InboxMessage) -> dict[str, Any]:
    """The operator's last ``skip`` history entry of ``message`` (empty if none)."""
    for entry in reversed(message.history or []):
        if entry.get("kind") == "skip":
            return dict(entry)
    return {}


def skipped_reason(entry: dict[str, Any]) -> str:
    """``last_error`` of a version an operator skipped (from the ``skip`` history entry)."""
    reason = entry.get("reason") or ""
    return f"skipped by {entry.get('by', '?')}" + (f": {reason}" if reason else "")
