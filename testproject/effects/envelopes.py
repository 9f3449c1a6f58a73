"""A custom envelope, for producers that put the id and type in headers of their own."""

from typing import Any

from django_inbox.broker.envelope import Envelope, parse


def from_legacy_headers(message: Any, **options: Any) -> Envelope:
    """Our legacy producers send ``X-Event-Id`` and ``X-Event-Name`` headers."""
    envelope = parse(message, **options)
    headers = message.headers or {}
    envelope.message_id = headers.get("X-Event-Id") or envelope.message_id
    envelope.event_type = headers.get("X-Event-Name") or envelope.event_type
    return envelope
