"""A guard for py-amqp's frame reader against headers nested past Python's recursion.

py-amqp decodes a message's properties inside ``drain_events``, before any callback of ours.
A sender can nest a header table a few thousand levels deep within one frame (decoding it
raises ``RecursionError``), send a timestamp in milliseconds (a year past 9999) or text that
is not UTF-8: decoding fails half-way through the message, the reader is left
expecting its header again, the connection breaks on the body, and the broker redelivers the
message to the next connection: ``inbox_consume`` would spin on it for ever (or exit, and be
restarted onto it).

:func:`install` makes the reader use :class:`GuardedMessage`, whose decoding turns such a
failure into a message whose properties are one header, :data:`UNREADABLE`, saying
so. Its id went with its properties, so it is refused at the broker (rejected without requeue,
to its dead-letter exchange, :mod:`.identity`): never kept under its body's ``id`` (often an
entity's, which other messages share), never run without its headers. The process-wide
change is limited to this one failure: every other header is decoded as py-amqp decodes it.
"""

from __future__ import annotations

import logging
from typing import Any

from amqp import abstract_channel, method_framing, serialization
from amqp.basic_message import Message

logger = logging.getLogger("django_inbox")

#: The one header of a message whose properties could not be decoded, and why.
UNREADABLE = "x-inbox-unreadable-properties"
REASON = "its AMQP properties are nested too deeply to decode"


class GuardedMessage(Message):  # type: ignore[misc]
    """py-amqp's message, whose header table may fail to decode without breaking the reader."""

    __slots__ = ()

    def _load_properties(self, class_id: int, buf: Any, offset: int) -> int:
        try:
            return int(super()._load_properties(class_id, buf, offset))
        except Exception as exc:  # RecursionError, UnicodeDecodeError, a date out of range…
            reason = f"its AMQP properties cannot be decoded ({type(exc).__name__})"
            if isinstance(exc, RecursionError):
                reason = REASON
            # Set as py-amqp sets it (a slot of its base class).
            self.properties = {"application_headers": {UNREADABLE: reason}}  # type: ignore[misc]
            logger.error("inbox_consume: a message arrived that cannot be read: %s", reason)
            return offset


#: The argument types of a method py-amqp may fail to decode as text that
#: :func:`_arguments` reads itself: ``basic.deliver`` (``sLbss``) is made of these.
_SIMPLE = frozenset("sLlBob")


def _arguments(format: str, buf: Any, offset: int) -> tuple[list[Any], int]:
    """py-amqp's ``loads``, and for a method whose short strings are not UTF-8 (a routing key
    or exchange name sent through a fanout, topic or headers exchange) the same arguments
    with those strings read leniently (invalid bytes kept as ``\\x..`` escapes).

    Without it py-amqp fails on ``basic.deliver`` before the message exists: it is never
    acknowledged nor refused, holds a prefetch slot for the connection's life (with a
    prefetch of 1 the queue stalls) and comes back at every reconnection.
    """
    try:
        return serialization.loads(format, buf, offset)  # type: ignore[no-any-return]
    except UnicodeDecodeError:
        if not set(format) <= _SIMPLE:
            raise
    values: list[Any] = []
    bits = bitcount = 0
    for kind in format:
        if kind == "b":
            if not bitcount:
                bits, bitcount = buf[offset], 8
                offset += 1
            values.append(bits & 1 == 1)
            bits, bitcount = bits >> 1, bitcount - 1
            continue
        bits = bitcount = 0
        if kind == "s":
            length = buf[offset]
            raw = bytes(buf[offset + 1 : offset + 1 + length])
            values.append(raw.decode("utf-8", "backslashreplace"))
            offset += 1 + length
        else:
            size = {"o": 1, "B": 2, "l": 4, "L": 8}[kind]
            values.append(int.from_bytes(buf[offset : offset + size], "big"))
            offset += size
    return values, offset


def install() -> None:
    """Make py-amqp's frame reader build :class:`GuardedMessage`, and its channels read a
    method's arguments with :func:`_arguments` (idempotent)."""
    method_framing.Message = GuardedMessage
    abstract_channel.loads = _arguments
