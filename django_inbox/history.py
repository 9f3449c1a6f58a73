"""Entries of a row's ``history``: one per failed attempt and per operator action.

Every entry is a JSON object with ``kind`` (``"error"`` for a failed attempt, including one
whose worker died, ``"LeaseExpired"``; ``"replay"``, ``"park"``, ``"retry"``, ``"skip"`` for
operator actions; ``"suppressed"`` for a ``@side_effect`` call a re-run did not make;
``"unreadable"`` for what a row held that was no entry, see :func:`readable`), ``at`` (ISO
8601) and fields of its kind.
"""

from __future__ import annotations

import json
import traceback
from datetime import datetime
from typing import Any

from .exceptions import HandlerOutcome
from .text import exception_message, storable

MAX_ENTRIES = 100
MAX_MESSAGE = 2000
MAX_TRACEBACK = 8000
MAX_ACTOR = 150


def error_entry(
    exc: BaseException | None,
    *,
    attempt: int,
    at: datetime,
    outcome: str,
    error_type: str | None = None,
    message: str | None = None,
    retry_at: datetime | None = None,
) -> dict[str, Any]:
    """Describe a failed attempt. Tracebacks keep their last lines, where the error is.

    ``retry_at`` is when the next attempt was scheduled (``failed`` outcomes only).
    Every text is made storable (:func:`~django_inbox.text.storable`): an exception may carry
    a NUL or a lone surrogate, or fail to print at all, and its failure must still be recorded.
    """
    tb = ""
    if exc is not None:
        error_type = error_type or type(exc).__name__
        message = message if message is not None else _message(exc)
        if not isinstance(exc, HandlerOutcome):
            tb = _traceback(exc)
    return {
        "kind": "error",
        "at": at.isoformat(),
        "attempt": attempt,
        "type": storable(error_type or "Error")[:MAX_ACTOR],
        "message": storable(message or "")[:MAX_MESSAGE],
        "traceback": storable(tb)[-MAX_TRACEBACK:],
        "outcome": outcome,
        "retry_at": retry_at.isoformat() if retry_at is not None else None,
    }


def _message(exc: BaseException) -> str:
    if isinstance(exc, HandlerOutcome):
        return storable(exc.reason)
    return exception_message(exc)


def _traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except Exception:  # a broken __str__ deep in a chain, a frame that cannot be read
        return f"{type(exc).__name__}: the traceback could not be formatted"


def summary(entry: dict[str, Any]) -> str:
    """The one line kept in ``last_error``."""
    text = f"{entry['type']}: {entry['message']}" if entry["message"] else entry["type"]
    return text[:MAX_MESSAGE]


#: Fields of an entry that readers treat as text (sliced, parsed as times, printed).
_TEXT_FIELDS = ("at", "retry_at", "type", "message", "traceback", "by", "via", "reason", "from")


def readable(stored: Any) -> list[dict[str, Any]]:
    """A stored ``history`` as a list of entries every reader can show, whatever the row holds.

    The inbox writes only well-formed entries, but a row written by hand or by another program
    may hold anything: ``null``, a string, entries that are not objects or lack a ``kind``,
    times that are numbers, a value too deep to decode. Such parts become ``"unreadable"``
    entries that keep their text; text fields of other types become text. The next change of
    the row writes the cleaned list back.
    """
    if stored is None:
        return []
    items = stored if isinstance(stored, list) else [stored]
    entries = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            entries.append({"kind": "unreadable", "stored": _as_text(item)})
            continue
        fixed = {
            name: _as_text(item[name])
            for name in _TEXT_FIELDS
            if item.get(name) is not None and not isinstance(item[name], str)
        }
        if item.get("at") is None:  # every entry says when; readers slice it
            fixed["at"] = ""
        entries.append({**item, **fixed} if fixed else item)
    return entries


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return storable(value)[:MAX_MESSAGE]
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        text = storable(value)
    return storable(text)[:MAX_MESSAGE]


def append(history: list[dict[str, Any]], entry: dict[str, Any]) -> list[dict[str, Any]]:
    """``history`` with ``entry`` added, keeping the first entry and the newest ones."""
    entries = [*readable(history), entry]
    if len(entries) > MAX_ENTRIES:
        entries = [entries[0], *entries[-(MAX_ENTRIES - 1) :]]
    return entries


def interrupted_entry(attempt: int, error: str, *, at: datetime) -> dict[str, Any]:
    """An attempt the loss of the database connection cut short, not counted."""
    return {
        "kind": "interrupted",
        "at": at.isoformat(),
        "attempt": attempt,
        "message": storable(
            f"the database connection was lost during attempt {attempt}"
            + (f" ({error})" if error else "")
            + "; the attempt is not counted"
        )[:MAX_MESSAGE],
    }


def suppressed_entry(
    function: str, attempt: int, *, at: datetime, calls: int = 1
) -> dict[str, Any]:
    """Calls of a ``@side_effect`` function that did not run in one attempt: the message was
    re-run and its consumer suppresses side effects on re-runs. Names the function and counts
    its calls, never their arguments."""
    return {
        "kind": "suppressed",
        "at": at.isoformat(),
        "attempt": attempt,
        "function": storable(function)[:MAX_ACTOR],
        "calls": calls,
        "message": "side effect not run: re-run of a completed message",
    }


def action_entry(
    kind: str,
    *,
    at: datetime,
    actor: str,
    reason: str,
    previous_status: str,
    attempts: int,
    via: str,
) -> dict[str, Any]:
    """Describe an operator action (replay, park, retry now) on a row: who, what, when, why."""
    return {
        "kind": kind,
        "at": at.isoformat(),
        "by": storable(actor)[:MAX_ACTOR],
        "via": storable(via),
        "reason": storable(reason)[:MAX_MESSAGE],
        "from": previous_status,
        "attempts": attempts,
    }
