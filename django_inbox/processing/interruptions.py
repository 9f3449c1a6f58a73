"""Claimed rows whose attempt the loss of the database connection cut short.

When the inbox's connection dies while a process holds claimed rows (the server restarted, the
backend was terminated, the network dropped, no connection slot was left), nothing of the
running attempt committed, and it was not the handler's fault. The process cannot say so
while the database is away, so it notes the rows here (and the lease of a claim whose reply
was lost) and gives them back as soon as it reaches the database again
(:func:`django_inbox.processing.giving_back.give_back_interrupted`): due now, attempt
uncounted, and for the row that was running an ``interrupted`` entry in its history.

A handler that kills its own connection every time must not loop for ever: a row's first
``max_attempts`` interruptions are free, later ones count as failed attempts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..models import InboxMessage
from ..text import cut, exception_message


@dataclass
class Noted:
    using: str
    rows: list[InboxMessage]
    #: The row whose handler was running (its history says it was interrupted), if any.
    running: InboxMessage | None = None
    #: A claim's lease whose reply was lost: its rows (if it committed) are given back.
    lease_id: str | None = None
    error: str = ""


_lock = threading.Lock()
_noted: list[Noted] = []


def note(
    rows: list[InboxMessage],
    *,
    using: str,
    running: InboxMessage | None = None,
    lease_id: str | None = None,
    error: BaseException | None = None,
) -> None:
    """Remember claimed rows (or a lost claim's lease) to give back once the database is back.

    A database out of disk or memory is treated the same way: the running row's interruption
    is free up to its ``max_attempts`` (the process waiting with backoff in between, up to 30
    s), then counted, so a handler that makes the database run out of memory every time still
    ends ``dead`` instead of holding its worker for ever."""
    text = "" if error is None else f"{type(error).__name__}: {exception_message(error)}"
    with _lock:
        _noted.append(
            Noted(
                using=using,
                rows=list(rows),
                running=running,
                lease_id=lease_id,
                error=cut(text.splitlines()[0] if text else "", 300),
            )
        )


def pending() -> bool:
    """Whether anything waits to be given back (a cheap check for hot paths)."""
    return bool(_noted)


def take(using: str) -> list[Noted]:
    with _lock:
        mine = [entry for entry in _noted if entry.using == using]
        _noted[:] = [entry for entry in _noted if entry.using != using]
    return mine


def put_back(entries: list[Noted]) -> None:
    """The database went away again while giving back: keep them for the next time."""
    with _lock:
        _noted[:0] = entries


def free_interruptions(row: InboxMessage) -> int:
    """How many interruptions of ``row`` went uncounted so far."""
    return sum(1 for entry in row.history if entry.get("kind") == "interrupted")
