"""The headers ``publish()`` writes: the caller's own, refused unless AMQP can carry them, and
the trace context carried from the inbox message a handler publishes from, dropped (never
fatal) unless it is valid and within its bounds.

A row's headers are published as an AMQP field table, which cannot carry everything JSON can:
integers must fit 64 signed bits, names (at every level) 255 bytes of UTF-8, and the table
travels in the message's properties, which must fit one frame. ``publish()`` refuses what the
relay could not send, so a row is never written only to end ``dead``.
"""

from __future__ import annotations

import json
import logging
import re
import struct
from collections.abc import Callable, Mapping
from typing import Any

from ..exceptions import InvalidPayload, PayloadTooLarge
from ..intake.validation import encode_json

logger = logging.getLogger("django_inbox.outbox")

#: AMQP's limit for a short string: exchange, routing key, type, header names (in bytes).
SHORT_MAX_BYTES = 255
#: Headers travel in the message's properties, which must fit one AMQP frame (128 KiB by
#: default, RabbitMQ's ``frame_max``): well below it, as JSON and as AMQP encodes them.
HEADERS_MAX_BYTES = 64 * 1024
#: What the header size errors name as the limit (it is not a setting).
HEADERS_LIMIT = "the outbox's fixed header limit (64 KiB, within one AMQP frame)"
#: The integers an AMQP field table carries (a signed 64-bit ``L``).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1

# W3C Trace Context (https://www.w3.org/TR/trace-context/): version, trace id, parent id,
# flags; a version other than 00 may add fields after a dash. 512 characters and 32 list
# members of tracestate are what every vendor must pass on.
_TRACEPARENT = re.compile(
    r"(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<parent>[0-9a-f]{16})-[0-9a-f]{2}"
    r"(?P<more>-[\x21-\x7e]*)?"
)
TRACEPARENT_MAX = 256
_TRACESTATE_KEY = (
    r"(?:[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13}|[a-z][_0-9a-z\-*/]{0,255})"
)
_TRACESTATE_MEMBER = re.compile(
    _TRACESTATE_KEY + r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
TRACESTATE_MAX_CHARS, TRACESTATE_MAX_MEMBERS = 512, 32
# W3C Baggage (https://www.w3.org/TR/baggage/): key (a token) = value (baggage octets), with
# optional ;properties; at most 8192 bytes and 180 list members.
_TOKEN = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_BAGGAGE_MEMBER = re.compile(
    rf"[ \t]*{_TOKEN}[ \t]*=[ \t]*[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*"
    rf"(?:;[ \t]*{_TOKEN}[ \t]*(?:=[ \t]*[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*)?)*"
)
BAGGAGE_MAX_BYTES, BAGGAGE_MAX_MEMBERS = 8192, 180
# B3 (https://github.com/openzipkin/b3-propagation): lower-hex ids, 64- or 128-bit trace ids.
_B3_TRACE_ID = re.compile(r"[0-9a-f]{16}|[0-9a-f]{32}")
_B3_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_B3_SINGLE = re.compile(
    r"[01d]|(?P<trace>[0-9a-f]{16}|[0-9a-f]{32})-(?P<span>[0-9a-f]{16})"
    r"(?:-[01d](?:-(?P<parent>[0-9a-f]{16}))?)?"
)


def own(headers: Mapping[Any, Any]) -> dict[str, Any]:
    """The caller's ``headers`` as a dict, or :class:`InvalidPayload` for a name that is not
    text (JSON would turn ``1`` into ``"1"``, silently)."""
    for name in headers:
        if not isinstance(name, str):
            raise InvalidPayload(
                f"header names must be strings, got {type(name).__name__} {_shown(name)}"
            )
    return dict(headers)


def encode(headers: dict[str, Any]) -> str:
    """The JSON text of ``headers``, or :class:`InvalidPayload` (:class:`PayloadTooLarge`) if
    it is not JSON, is too large, or holds what an AMQP field table cannot carry."""
    if not headers:
        return "{}"
    text = encode_json("headers", headers, max_bytes=HEADERS_MAX_BYTES, bytes_setting=HEADERS_LIMIT)
    from amqp.serialization import dumps

    try:
        as_sent = json.loads(text)  # what the relay reads back: tuples are lists, keys text
        check_table(as_sent, "headers")
        size = len(dumps("F", [as_sent]))
    except InvalidPayload:
        raise
    except RecursionError:  # INBOX_MAX_JSON_DEPTH set past what Python (and py-amqp) nest
        raise InvalidPayload("headers are nested too deep for an AMQP field table") from None
    except (ValueError, TypeError, struct.error) as exc:  # a case the walk above missed
        raise InvalidPayload(f"headers cannot be sent as an AMQP field table: {exc}") from None
    if size > HEADERS_MAX_BYTES:
        raise PayloadTooLarge(
            f"headers take {size} bytes as an AMQP field table; {HEADERS_LIMIT} allows "
            f"{HEADERS_MAX_BYTES}"
        )
    return text


#: Headers RabbitMQ reads itself (sender-selected distribution): an array of strings, or it
#: closes the channel (406) under the whole batch.
ROUTING_HEADERS = ("CC", "BCC")


def check_table(value: Any, path: str) -> None:
    """:class:`InvalidPayload` naming the first value under ``path`` AMQP cannot carry."""
    if path == "headers" and isinstance(value, dict):
        for name in ROUTING_HEADERS:
            routed = value.get(name)
            if name in value and not (
                isinstance(routed, list) and all(isinstance(item, str) for item in routed)
            ):
                raise InvalidPayload(
                    f"header {name!r} routes the message at RabbitMQ (sender-selected "
                    "distribution) and must be a list of routing keys"
                )
    if isinstance(value, dict):
        for name, item in value.items():
            size = len(name.encode("utf-8"))
            if size > SHORT_MAX_BYTES:
                where = "header name" if path == "headers" else f"a name in {path},"
                raise InvalidPayload(
                    f"{where} {_shown(name)} is {size} bytes of UTF-8; AMQP allows "
                    f"{SHORT_MAX_BYTES}"
                )
            check_table(item, f"{path}[{_shown(name)}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_table(item, f"{path}[{index}]")
    elif isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
        raise InvalidPayload(
            f"{path} is an integer of {value.bit_length()} bits; AMQP carries integers from "
            "-2**63 to 2**63-1 (send a larger one as a string)"
        )
    elif isinstance(value, float) and value.is_integer() and not INT_MIN <= value <= INT_MAX:
        # PostgreSQL's jsonb keeps 1e19 as the number 10000000000000000000: the relay reads
        # it back as an integer AMQP cannot carry.
        raise InvalidPayload(
            f"{path} is {value!r}, which the outbox's table keeps as an integer beyond 64 "
            "bits; AMQP carries integers from -2**63 to 2**63-1 (send it as a string)"
        )


def _shown(name: Any) -> str:
    text = repr(name)
    return text if len(text) <= 40 else f"{text[:37]}..."


def carried(incoming: Any, taken: Mapping[str, Any]) -> dict[str, str]:
    """The trace headers of ``incoming`` (an inbox message's headers) to pass on, those not in
    ``taken`` (the caller's own win). One that is not valid or is over its bound is left out,
    with a log line naming it (never its value); ``tracestate`` goes only with a valid
    ``traceparent``, as W3C Trace Context says."""
    if not isinstance(incoming, Mapping):
        return {}
    found: dict[str, str] = {}
    for name, check in CHECKS.items():
        value = incoming.get(name)
        if value is None or name in taken:
            continue
        if name == "tracestate" and "traceparent" not in found and "traceparent" not in taken:
            dropped(name, "it goes only with a valid traceparent")
            continue
        why = "not a string" if not isinstance(value, str) else check(value)
        if why:
            dropped(name, why)
        else:
            found[name] = value
    return found


def dropped(name: str, why: str) -> None:
    logger.info("publish(): the incoming message's %s header is not passed on: %s", name, why)


def _traceparent(value: str) -> str | None:
    match = _TRACEPARENT.fullmatch(value) if len(value) <= TRACEPARENT_MAX else None
    if match is None:
        return "not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)"
    if match["version"] == "ff" or (match["version"] == "00" and match["more"]):
        return f"not a W3C traceparent of a known version ({match['version']})"
    if set(match["trace"]) == {"0"} or set(match["parent"]) == {"0"}:
        return "its trace id or parent id is all zeros"
    return None


def _tracestate(value: str) -> str | None:
    if len(value) > TRACESTATE_MAX_CHARS:
        return f"over {TRACESTATE_MAX_CHARS} characters"
    members = [member.strip(" \t") for member in value.split(",")]
    members = [member for member in members if member]
    if len(members) > TRACESTATE_MAX_MEMBERS:
        return f"over {TRACESTATE_MAX_MEMBERS} list members"
    if not all(_TRACESTATE_MEMBER.fullmatch(member) for member in members):
        return "not a W3C tracestate list (key=value, ...)"
    return None


def _baggage(value: str) -> str | None:
    if len(value.encode("utf-8", "surrogatepass")) > BAGGAGE_MAX_BYTES:
        return f"over {BAGGAGE_MAX_BYTES} bytes"
    members = value.split(",")
    if len(members) > BAGGAGE_MAX_MEMBERS:
        return f"over {BAGGAGE_MAX_MEMBERS} list members"
    if not all(_BAGGAGE_MEMBER.fullmatch(member) for member in members):
        return "not a W3C baggage list (key=value, ...)"
    return None


def _b3(value: str) -> str | None:
    match = _B3_SINGLE.fullmatch(value)
    if match is None:
        return "not a B3 single header ({trace id}-{span id}[-{sampled}[-{parent id}]])"
    if any(match[part] and set(match[part]) == {"0"} for part in ("trace", "span", "parent")):
        return "an id in it is all zeros"
    return None


def _b3_id(pattern: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if pattern.fullmatch(value) is None:
            return f"not a B3 {what} (lower-case hex)"
        return "it is all zeros" if set(value) == {"0"} else None

    return check


#: Trace context passed on from the inbox message a handler publishes from (W3C, B3), each
#: with its check: the reason it is not passed on, or ``None``.
CHECKS: dict[str, Callable[[str], str | None]] = {
    "traceparent": _traceparent,
    "tracestate": _tracestate,
    "baggage": _baggage,
    "b3": _b3,
    "x-b3-traceid": _b3_id(_B3_TRACE_ID, "trace id of 16 or 32 digits"),
    "x-b3-spanid": _b3_id(_B3_SPAN_ID, "span id of 16 digits"),
}
TRACE_HEADERS = tuple(CHECKS)
