"""``adeliver()`` and ``astore()``: :func:`~django_inbox.deliver` and
:func:`~django_inbox.store` for async views and async consumers.

The same arguments, results and exceptions. The work runs where Django runs async code's
database work (``sync_to_async(thread_sensitive=True)``): in an ASGI request, on that
request's thread; elsewhere, on the one thread Django keeps for it. The inbox's transaction is
opened and committed there, never across an ``await``.

A caller cancelled while its message is being stored or processed (a client that went away)
stops waiting, not the work: the message is stored, or processed and committed, as if the
caller had waited, and a resend is answered as a duplicate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async

from ..outcomes import Outcome


async def adeliver(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
    sequence: int | None = None,
    redelivered: bool = False,
) -> Outcome:
    """Store one message and process it inline, from async code: :func:`~django_inbox.deliver`."""
    from .delivery import deliver

    return await sync_to_async(deliver, thread_sensitive=True)(
        consumer=consumer,
        message_id=message_id,
        event_type=event_type,
        payload=payload,
        headers=headers,
        source=source,
        key=key,
        sequence=sequence,
        redelivered=redelivered,
    )


async def astore(
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    payload: Any,
    headers: Mapping[str, Any] | None = None,
    source: str | None = "",
    key: str | None = "",
    sequence: int | None = None,
) -> bool:
    """Store one message for a worker, from async code: :func:`~django_inbox.store`."""
    from .storing import store

    return await sync_to_async(store, thread_sensitive=True)(
        consumer=consumer,
        message_id=message_id,
        event_type=event_type,
        payload=payload,
        headers=headers,
        source=source,
        key=key,
        sequence=sequence,
    )
