"""The keyword arguments that make a message, as one type (for helpers that pass them on)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Required, TypedDict


class MessageFields(TypedDict, total=False):
    """What :func:`~django_inbox.deliver` and :func:`~django_inbox.store` take to name and
    carry a message; helpers that pass a message on take ``**message: Unpack[MessageFields]``.
    """

    consumer: Required[str]
    message_id: Required[str]
    event_type: Required[str]
    payload: Required[Any]
    headers: Mapping[str, Any] | None
    source: str | None
    key: str | None
    sequence: int | None
