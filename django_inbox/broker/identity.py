"""Reading a broker message's identity, and the other fields that say what it is, as text.

One set of rules for the envelope reader (:func:`~.envelope.parse`) and for a message the
reader failed on (:func:`~.envelope.identity`): the id is the first of these that the message
carries, and must then be text; it is never read around:

1. the AMQP ``message_id`` property;
2. a ``message_id`` header;
3. a CloudEvents id (``ce-id``/``ce_id`` header, else a structured event's ``id``), with its
   ``source`` in front (``"<source>#<id>"``) when it has one; a source holding ``#`` makes that
   identity ambiguous and the message is refused;
4. (the envelope reader only) the ``id`` of a JSON object body that is no structured event.

A value that is not text (an AMQP table or array, a boolean, bytes that are not UTF-8) in the
step that names the id refuses the message: read as text anyway it would be ``""`` (and the
next step's id taken) or hex (``\\xab\\xcd`` read ``"abcd"``), either of which can be another
message's id. A message whose properties were lost (:mod:`.amqp_guard`) has no id.
"""

from __future__ import annotations

import binascii
from typing import Any

from .amqp_guard import UNREADABLE

#: Headers that say what a message is and where it goes in its key's order: text, or the
#: message is kept dead rather than run without them or under another key.
TYPE_HEADERS = ("ce-type", "ce_type", "event_type")
KEY_HEADERS = ("ce-partitionkey", "ce_partitionkey", "partition_key", "key")


class Unreadable(ValueError):
    """The message's id cannot be read: the reason, for the refusal's log line."""


def read_id(
    properties: dict[str, Any],
    headers: dict[str, Any],
    cloudevent: dict[str, Any] | None = None,
    body: Any = None,
) -> str | None:
    """The message id (see the module), ``None`` if the message has none; raises
    :class:`Unreadable` when the step that names it cannot be read as text."""
    if UNREADABLE in headers:
        raise Unreadable(f"the message arrived without its properties: {headers[UNREADABLE]}")
    attributes = cloudevent or {}
    for where, values, name in (
        ("property", properties, "message_id"),
        ("header", headers, "message_id"),
    ):
        if _present(values.get(name)):
            return _as_id(values[name], f"its {name} {where}")
    ce_id = _first_present((headers, "ce-id"), (headers, "ce_id"), (attributes, "id"))
    if ce_id is not None:
        found = _as_id(ce_id[1], f"its CloudEvents id ({ce_id[0]!r})")
        source = _first_present(
            (headers, "ce-source"), (headers, "ce_source"), (attributes, "source")
        )
        if source is None:
            return found
        prefix = _as_id(source[1], f"its CloudEvents source ({source[0]!r})")
        if "#" in prefix:
            raise Unreadable(
                f"its CloudEvents source {prefix[:100]!r} holds '#', which makes the identity "
                "source#id ambiguous"
            )
        return f"{prefix}#{found}"
    if isinstance(body, dict) and cloudevent is None and _present(body.get("id")):
        return text(body["id"]) or None
    return None


def unusable(values: dict[str, Any], names: tuple[str, ...]) -> str | None:
    """Why one of ``names`` in ``values`` is no text, or ``None``."""
    for name in names:
        why = _not_text(values.get(name))
        if why:
            return f"{name!r} is {why}"
    return None


def first_text(values: dict[str, Any], *names: str) -> str:
    """The first of ``names`` that ``values`` holds as non-empty text, else ``""``."""
    for name in names:
        found = text(values.get(name))
        if found:
            return found
    return ""


def text(value: Any) -> str:
    """A header or property value as text, for fields that only inform (a source, a type
    already checked); ``""`` for what is no text."""
    if value is None or isinstance(value, (dict, list, bool)):
        return ""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return binascii.hexlify(value).decode("ascii")
    try:
        return str(value)
    except ValueError:  # an integer past Python's 4,300-digit limit: no usable text
        return ""


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != b""


def _first_present(*places: tuple[dict[str, Any], str]) -> tuple[str, Any] | None:
    for values, name in places:
        if _present(values.get(name)):
            return name, values[name]
    return None


def _as_id(value: Any, what: str) -> str:
    why = _not_text(value)
    found = "" if why else text(value)
    if why or not found:
        raise Unreadable(f"{what} is {why or 'empty as text'}")
    return found


def _not_text(value: Any) -> str | None:
    """Why ``value`` is no text (``None``: it is text, UTF-8 bytes, an integer, or absent)."""
    if value is None or isinstance(value, str):
        return None
    if isinstance(value, bytes):
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes that are not UTF-8 text"
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{type(value).__name__}, not text"
    return None
