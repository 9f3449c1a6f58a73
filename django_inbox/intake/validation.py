"""Checks on incoming messages: a bad one raises before anything is stored."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from ..exceptions import InvalidField, InvalidMessageId, InvalidPayload, PayloadTooLarge

MESSAGE_ID_MAX = 255
CONSUMER_MAX = 100
TEXT_MAX = 255

# An escaped NUL that is not itself the tail of an escaped backslash.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def clean_message_id(value: object) -> str:
    """Return the message id as text, or raise :class:`InvalidMessageId`."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1024:
        # Over 255 digits anyway; str() would refuse past Python's 4,300-digit limit.
        raise InvalidMessageId(
            f"message_id is an integer of {value.bit_length()} bits; the limit is "
            f"{MESSAGE_ID_MAX} characters"
        )
    if isinstance(value, (int, uuid.UUID)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise InvalidMessageId(f"message_id must be a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidMessageId(
            "message_id is empty; a message without an id cannot be deduplicated"
        )
    if len(value) > MESSAGE_ID_MAX:
        raise InvalidMessageId(
            f"message_id is {len(value)} characters long; the limit is {MESSAGE_ID_MAX}"
        )
    if "\x00" in value:
        raise InvalidMessageId("message_id contains a NUL character")
    if not _is_unicode(value):
        raise InvalidMessageId("message_id contains a lone surrogate, which is not valid Unicode")
    return value


def clean_text(name: str, value: object, *, required: bool, max_length: int = TEXT_MAX) -> str:
    """Validate ``consumer``, ``event_type``, ``source`` or ``key``."""
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise InvalidField(f"{name} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise InvalidField(f"{name} is empty")
    if len(value) > max_length:
        raise InvalidField(f"{name} is {len(value)} characters long; the limit is {max_length}")
    if "\x00" in value:
        raise InvalidField(f"{name} contains a NUL character")
    if not _is_unicode(value):
        raise InvalidField(f"{name} contains a lone surrogate, which is not valid Unicode")
    return value


#: The largest sequence a row holds (a signed 64-bit column).
SEQUENCE_MAX = 2**63 - 1
#: The most attempts a row counts (the inbox's and the outbox's ``attempts``: a 32-bit
#: ``integer`` on PostgreSQL). Claims stop counting there instead of failing on the row.
ATTEMPTS_MAX = 2**31 - 1


def clean_sequence(value: object) -> int | None:
    """Return the sequence (an int from 0 to :data:`SEQUENCE_MAX`, or ``None``), or raise
    :class:`InvalidField`. Digit strings are taken (broker headers carry text)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        digits = value.strip()
        if len(digits) > len(str(SEQUENCE_MAX)):  # int() refuses past 4,300 digits
            raise InvalidField(
                f"sequence must be between 0 and {SEQUENCE_MAX}, got {len(digits)} digits"
            )
        value = int(digits)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(f"sequence must be an integer, got {type(value).__name__}")
    if not 0 <= value <= SEQUENCE_MAX:
        shown = value if value.bit_length() <= 64 else f"an integer of {value.bit_length()} bits"
        raise InvalidField(f"sequence must be between 0 and {SEQUENCE_MAX}, got {shown}")
    return value


def _is_unicode(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_json(
    name: str,
    value: Any,
    *,
    max_bytes: int | None = None,
    max_depth: int | None = None,
    bytes_setting: str = "INBOX_MAX_PAYLOAD_BYTES",
) -> str:
    """Encode ``value`` as JSON text that every supported database can store, and every
    process can read back.

    Raises :class:`InvalidPayload` for values that are not JSON (objects, NaN, Infinity), for
    NUL characters and lone surrogates (PostgreSQL's ``jsonb`` refuses both), for values
    nested more than ``max_depth`` levels deep (default: ``INBOX_MAX_JSON_DEPTH``), and
    :class:`PayloadTooLarge` when the UTF-8 encoding exceeds ``max_bytes`` (the limit named
    ``bytes_setting`` in the error).
    """
    said = "INBOX_MAX_JSON_DEPTH allows"
    if max_depth is None:
        max_depth, said = max_json_depth()
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as exc:
        raise InvalidPayload(
            f"{name} is not valid JSON: {exc} (NaN and Infinity are refused)"
        ) from None
    except TypeError as exc:
        raise InvalidPayload(f"{name} is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise InvalidPayload(_too_deep(name, max_depth, said)) from None
    if nesting_exceeds(text, max_depth):
        raise InvalidPayload(_too_deep(name, max_depth, said))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidPayload(
            f"{name} contains a lone surrogate, which is not valid Unicode"
        ) from None
    if max_bytes is not None and size > max_bytes:
        raise PayloadTooLarge(f"{name} is {size} bytes encoded; {bytes_setting} allows {max_bytes}")
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        raise InvalidPayload(f"{name} contains a NUL character (\\u0000), which cannot be stored")
    return text


# A JSON string, escapes included: what may hold brackets that nest nothing.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_ASCII_NOT_A_BRACKET = {code: None for code in range(128) if chr(code) not in "[]{}"}
#: An innermost pair: removing every one of them takes one level off each nesting.
_INNERMOST = re.compile(r"\[\]|\{\}")
#: Levels taken off so before the walk: each leaves fewer, longer runs of brackets.
PEELED_LEVELS = 8
_RUNS = re.compile(r"[\[{]+|[\]}]+")


def nesting_exceeds(text: str, limit: int) -> bool:
    """Whether the JSON ``text`` nests arrays and objects more than ``limit`` levels deep.

    Counting brackets answers most payloads at once (fewer brackets than the limit cannot
    nest deeper). The others lose their strings (which may hold brackets), then everything
    but brackets; then the innermost pairs go, one level per pass, a few levels at C speed,
    and one walk over the runs of brackets left counts the rest (about 30 µs for 4 KB of
    objects in arrays; linear in the size, whatever the nesting).
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    if "\\" in text:
        text = _JSON_STRING.sub("", text)
    elif '"' in text:  # no escapes: every other piece between quotes is a string
        text = "".join(text.split('"')[::2])
    if text.isascii():
        brackets = text.translate(_ASCII_NOT_A_BRACKET)
    else:
        brackets = _NOT_A_BRACKET.sub("", text)
    # Innermost pairs first, a few levels (leaves are most of a wide payload's brackets)...
    peeled = 0
    while brackets and peeled < min(limit, PEELED_LEVELS):
        brackets, peeled = _INNERMOST.sub("", brackets), peeled + 1
    if not brackets or peeled == limit:
        return bool(brackets)
    # ... then the rest in one walk over runs of brackets, each far fewer than the brackets.
    depth = 0
    for run in _RUNS.finditer(brackets):
        if run[0][0] in "[{":
            depth += len(run[0])
            if depth + peeled > limit:
                return True
        else:
            depth -= len(run[0])
    return False


#: MariaDB checks its JSON columns with ``json_valid()``, which refuses a value nested 32
#: levels or more (MySQL's own JSON type takes 100).
MARIADB_JSON_DEPTH = 31


def max_json_depth() -> tuple[int, str]:
    """The deepest nesting a stored value may have (``INBOX_MAX_JSON_DEPTH``, or less where
    the inbox's database cannot store it), and what sets it, for the error."""
    from django.db import connections

    from ..conf import inbox_settings

    depth = inbox_settings.max_json_depth
    if depth > MARIADB_JSON_DEPTH:
        connection = connections[inbox_settings.database]
        if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
            return MARIADB_JSON_DEPTH, "MariaDB's JSON columns (json_valid) allow"
    return depth, "INBOX_MAX_JSON_DEPTH allows"


def _too_deep(name: str, limit: int, said: str = "INBOX_MAX_JSON_DEPTH allows") -> str:
    return (
        f"{name} is nested more than {limit} levels deep; {said} {limit} "
        "(deeper values can stop the processes that read them back)"
    )
