"""Moved to :mod:`django_inbox.broker.envelope`; this path still works (``INBOX_ENVELOPE``
settings and envelope readers written against it) and will be removed in a later release."""

from ..broker.envelope import JSON_CONTENT_TYPES, RAW_LIMIT, BrokerMessage, Envelope, parse

__all__ = ["JSON_CONTENT_TYPES", "RAW_LIMIT", "BrokerMessage", "Envelope", "parse"]
