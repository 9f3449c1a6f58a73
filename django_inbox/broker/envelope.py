"""Reading a broker message: its identity, type, payload, and whether it can be handled at all.

The message id is never invented here: a message without one is refused at the broker, because
an id made up on arrival would differ on every redelivery and defeat deduplication.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, Protocol
from uuid import UUID

from .identity import KEY_HEADERS, TYPE_HEADERS, Unreadable, first_text, read_id, text, unusable

JSON_CONTENT_TYPES = ("application/json", "text/json", "application/cloudevents+json")
CLOUDEVENTS_STRUCTURED = "application/cloudevents+json"
RAW_LIMIT = 64 * 1024


class BrokerMessage(Protocol):
    """What the envelope reads from a kombu message."""

    @property
    def body(self) -> Any: ...

    @property
    def content_type(self) -> str | None: ...

    @property
    def content_encoding(self) -> str | None: ...

    @property
    def headers(self) -> dict[str, Any] | None: ...

    @property
    def properties(self) -> dict[str, Any]: ...

    @property
    def delivery_info(self) -> dict[str, Any]: ...


@dataclass
class Envelope:
    """A broker message as the inbox sees it.

    ``problem`` says why the message cannot be handled (an undecodable body, an unsupported
    content type); such a message is kept ``dead`` with its raw body in ``payload``.
    """

    message_id: str | None
    event_type: str | None
    payload: Any
    headers: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    key: str = ""
    #: The key's version, as the message carries it (validated by ``deliver()``/``store()``).
    sequence: Any = None
    redelivered: bool = False
    problem: str | None = None
    #: The message named a key that could not be read: ``key`` is blank, and it is kept dead
    #: (``KeyLost``) so that no replay runs it outside its key's order.
    key_lost: bool = False


def parse(message: BrokerMessage, *, raw_limit: int = RAW_LIMIT) -> Envelope:
    """Read a kombu message (RabbitMQ, Redis, SQS, filesystem transports alike).

    Identity: the AMQP ``message_id`` property, else a ``message_id``, ``ce-id`` or ``ce_id``
    header, else the JSON body's ``id`` (a structured CloudEvent's ``id``). A CloudEvent's
    identity is its ``source`` plus its ``id``, so ``message_id`` becomes ``"<source>#<id>"``
    when the id is a CloudEvents id with a source.

    Ordering: the key from a ``ce-partitionkey``/``partition_key``/``key`` header, the
    sequence from a ``sequence``/``ce-sequence`` header (see :func:`_sequence`).

    Type: the AMQP ``type`` property, else a ``ce-type``/``ce_type``/``event_type`` header,
    else the body's ``type``. Content types: JSON and CloudEvents JSON (structured, whose
    ``data`` is the payload, or binary mode with ``ce-*`` headers). An undecodable body is
    kept as ``{"raw": …, "raw_encoding": "utf-8"|"base64", …}``, cut at ``raw_limit`` bytes.
    """
    properties = message.properties or {}
    raw_headers = dict(message.headers or {})
    headers = _json_safe(raw_headers)
    content_type = (message.content_type or "").split(";")[0].strip().lower()
    raw = message.body if isinstance(message.body, bytes) else str(message.body).encode()

    body, problem = _decode(raw, content_type, message.content_encoding)
    cloudevent = _structured_cloudevent(body, content_type)
    payload = body
    ce_attributes: dict[str, Any] = {}
    if cloudevent is not None:
        payload = cloudevent.get("data")
        if payload is None and "data_base64" in cloudevent:
            payload = {"data_base64": cloudevent["data_base64"]}
        ce_attributes = {k: v for k, v in cloudevent.items() if k not in ("data", "data_base64")}
        headers["cloudevent"] = ce_attributes

    try:
        message_id = read_id(properties, raw_headers, cloudevent, body)
    except Unreadable as exc:
        # Never an id read around the one that could not be read: it could be another's.
        message_id, problem = None, f"the message's id cannot be read: {exc}"
    key_lost = bool(message_id) and bool(
        unusable(raw_headers, KEY_HEADERS) or unusable(ce_attributes, ("partitionkey",))
    )
    if message_id:
        order = unusable(raw_headers, (*TYPE_HEADERS, *KEY_HEADERS)) or unusable(
            ce_attributes, ("type", "partitionkey")
        )
        if order:
            problem = problem or f"the message's type or key cannot be read: {order}"
    ce_source = first_text(headers, "ce-source", "ce_source") or text(ce_attributes.get("source"))

    event_type = (
        text(properties.get("type"))
        or first_text(headers, "ce-type", "ce_type", "event_type")
        or text(ce_attributes.get("type"))
        or (text(body.get("type")) if isinstance(body, dict) else None)
    )
    if problem is not None:
        payload = _raw_payload(raw, content_type, raw_limit)
    return Envelope(
        message_id=message_id or None,
        event_type=event_type or None,
        payload=payload,
        headers=headers,
        source=text(ce_source) or text(properties.get("app_id")) or "",
        key=""  # never a hex spelling, nor the next header's: another aggregate's key
        if key_lost
        else first_text(headers, *KEY_HEADERS) or text(ce_attributes.get("partitionkey")),
        key_lost=key_lost,
        sequence=_sequence(headers, ce_attributes),
        redelivered=_redelivered(message, headers),
        problem=problem,
    )


def _sequence(headers: dict[str, Any], ce_attributes: dict[str, Any]) -> Any:
    """A ``sequence`` header (``ce-sequence``/``ce_sequence`` for CloudEvents' sequence
    extension, or a structured CloudEvent's ``sequence``); ``None`` if there is none."""
    for name in ("sequence", "ce-sequence", "ce_sequence"):
        if headers.get(name) is not None:
            return headers[name]
    return ce_attributes.get("sequence")


def identity(message: BrokerMessage) -> str | None:
    """The message id from the broker's properties and headers alone, never the body
    (:func:`~.identity.read_id`); ``None`` if there is none or it cannot be read.

    For a message the envelope reader could not read at all: if it has an id, it can still be
    kept ``dead`` under that id (and its redeliveries answered as duplicates).
    """
    try:
        return read_id(dict(message.properties or {}), dict(message.headers or {}))
    except Exception:
        return None


def raw_body(message: BrokerMessage, limit: int = RAW_LIMIT) -> dict[str, Any]:
    """The body as an operator can read it, whatever it holds (see :func:`parse`)."""
    try:
        body = message.body
        raw = body if isinstance(body, bytes) else str(body).encode("utf-8", "backslashreplace")
        content_type = (message.content_type or "").split(";")[0].strip().lower()
    except Exception:
        raw, content_type = b"", ""
    return _raw_payload(raw, content_type, limit)


def _decode(raw: bytes, content_type: str, encoding: str | None) -> tuple[Any, str | None]:
    if (
        content_type
        and content_type not in JSON_CONTENT_TYPES
        and not content_type.endswith("+json")
    ):
        return None, (
            f"unsupported content type {content_type!r}; "
            "expected application/json or application/cloudevents+json"
        )
    charset = (encoding or "utf-8").lower()
    if charset in ("binary", "8bit", "7bit"):
        charset = "utf-8"
    try:
        text = raw.decode(charset)
    except (UnicodeError, LookupError) as exc:
        # UnicodeError, not only UnicodeDecodeError: some codecs ("undefined") raise the base.
        return None, f"body is not valid {charset} text: {exc}"
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite), None
    except ValueError as exc:
        return None, f"body is not valid JSON: {exc}"
    except RecursionError:
        return None, "body is not valid JSON: nested too deeply"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


def _structured_cloudevent(body: Any, content_type: str) -> dict[str, Any] | None:
    if not isinstance(body, dict):
        return None
    if content_type == CLOUDEVENTS_STRUCTURED or ("specversion" in body and "id" in body):
        return body
    return None


def _raw_payload(raw: bytes, content_type: str, limit: int) -> dict[str, Any]:
    """The undecodable body, kept for an operator: text if it is text, else base64."""
    head = raw[: max(limit, 0)]
    text: str | None = None
    for trim in range(4):  # a cut inside a multi-byte character: drop its first bytes
        try:
            text = head[: len(head) - trim].decode("utf-8")
        except UnicodeDecodeError:
            continue
        head = head[: len(head) - trim]
        break
    kept: dict[str, Any]
    if text is not None and "\x00" not in text and text.encode("utf-8") == head:
        kept = {"raw": text, "raw_encoding": "utf-8"}
    else:
        kept = {"raw": base64.b64encode(head).decode("ascii"), "raw_encoding": "base64"}
    kept["content_type"] = content_type
    kept["bytes"] = len(raw)
    if len(raw) > len(head):
        kept["truncated"] = True
    return kept


def _redelivered(message: BrokerMessage, headers: dict[str, Any]) -> bool:
    info = message.delivery_info or {}
    if info.get("redelivered") or headers.get("redelivered") is True:
        return True
    count = headers.get("x-delivery-count")  # RabbitMQ quorum queues
    try:
        return count is not None and int(count) > 0
    except (TypeError, ValueError):
        return False


def _json_safe(value: Any) -> Any:
    """Broker headers may hold bytes, dates and decimals (AMQP tables); keep them as JSON."""
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
