"""Making text storable: the one place that cleans what the inbox writes but did not choose.

A handler's exception message, a traceback, an operator's reason, a broker header: any of
them may hold a NUL character (PostgreSQL's ``text`` and ``jsonb`` refuse it) or a lone
surrogate (no database can encode it as UTF-8). Writing such text would fail the very
statement that records the failure, and the message would be stuck. Everything the inbox
stores from outside goes through :func:`storable` (or :func:`storable_json`) first, which
replaces those characters *visibly*: a NUL becomes the four characters ``\\x00`` and a lone
surrogate its ``\\udXXX`` escape, so an operator reading the text sees what was there.

Message ids, event types and payloads given to :func:`~django_inbox.deliver` are not cleaned
but refused (:mod:`django_inbox.intake.validation`): changing them would change what the message is.
"""

from __future__ import annotations

import traceback
from typing import Any

#: What a NUL character is replaced with.
NUL_REPLACEMENT = "\\x00"


def storable(value: object) -> str:
    """``value`` as text every supported database can store.

    Never raises: an object whose ``__str__`` fails is described by its type instead.
    """
    if isinstance(value, str):
        text = value
    else:
        try:
            text = str(value)
        except Exception:
            text = f"<unprintable {type(value).__name__} object>"
        if not isinstance(text, str):  # a str subclass's __str__ may return anything
            text = f"<unprintable {type(value).__name__} object>"
    if "\x00" in text:
        text = text.replace("\x00", NUL_REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def exception_message(exc: BaseException) -> str:
    """``str(exc)``, storable, and never raising (a broken ``__str__`` gives its type)."""
    try:
        text = str(exc)
    except Exception:
        return f"<unprintable {type(exc).__name__}>"
    return storable(text)


def storable_json(value: Any) -> Any:
    """A JSON value whose strings, keys included, are all :func:`storable`."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(key): storable_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [storable_json(item) for item in value]
    return value


def cut(value: str, limit: int) -> str:
    """``value`` shortened to ``limit`` characters, an ellipsis marking the cut."""
    return value if len(value) <= limit else value[: max(limit - 1, 0)] + "…"


def exception_text(exc: BaseException) -> str:
    """An exception for a log line: its type and the frames it went through, never its
    message (nor a chained exception's), which may quote a payload or header value.

    Handler exceptions are kept whole in the row's ``history`` (see the admin); a log line
    only says what was raised and where.
    """
    kind = type(exc)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    text = f"{name} (its message is not logged: it may quote the payload)"
    frames = traceback.format_list(traceback.extract_tb(exc.__traceback__))
    if frames:
        text += "\nTraceback (most recent call last):\n" + "".join(frames).rstrip("\n")
    return text


def printable(value: str) -> str:
    """``value`` for a line of a log: characters that are not printable (control characters,
    line and paragraph separators, bidirectional overrides) shown as their escapes, so an id
    chosen by a sender cannot start a forged log line. The record's structured fields keep
    the value as it is."""
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in value)
