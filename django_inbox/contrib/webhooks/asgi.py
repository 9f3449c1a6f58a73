"""``webhook_body_limit()``: webhook bodies refused past their limit before Django reads them.

Django's ASGI handler reads a request's whole body (to memory, then to a temporary file)
before any view runs, so under ASGI a view's own check of the body's size comes too late: a
sender could make the server take gigabytes. Wrapped in :func:`webhook_body_limit`, an ASGI
application refuses, for the paths that resolve to a :func:`webhook_view`:

* a declared ``Content-Length`` over the view's limit with 413, reading none of the body;
* a body that grows past the limit as it arrives (chunked, or longer than declared) with 413,
  having read at most the limit and one chunk;
* a body that does not arrive within ``timeout`` seconds (a sender that stalls: a slow-body
  attack holds a connection and its memory) with 408.

Nothing is stored for those; the connection is closed. Other paths pass through untouched.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.urls import Resolver404, resolve

from ...conf import inbox_settings

logger = logging.getLogger("django_inbox.webhooks")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Seconds a webhook's whole body may take to arrive.
BODY_TIMEOUT = 30.0


def webhook_body_limit(application: ASGIApp, *, timeout: float = BODY_TIMEOUT) -> ASGIApp:
    """``application`` (Django's ASGI application), with webhook bodies read by their limit.

    In ``asgi.py``::

        application = webhook_body_limit(get_asgi_application())
    """

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        limit = _limit(scope) if scope["type"] == "http" else None
        if limit is None:
            await application(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, 413, f"the body is larger than {limit} bytes")
            return
        messages: list[Message] = []
        size = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                await _refuse(send, 408, f"the body did not arrive within {timeout:g}s")
                return
            if message["type"] == "http.disconnect":
                return  # the sender went away: nothing to answer, nothing stored
            size += len(message.get("body", b""))
            if size > limit:
                await _refuse(send, 413, f"the body is larger than {limit} bytes")
                return
            messages.append(message)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()  # after the body: the disconnect, when it comes

        await application(scope, replay, send)

    return limited


def _limit(scope: Scope) -> int | None:
    """The body limit of the webhook view ``scope``'s path resolves to; ``None`` for a path
    that is not a webhook view's."""
    path = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    try:
        match = resolve(path)
    except Resolver404:
        if not settings.APPEND_SLASH or path.endswith("/"):
            return None
        # Django would redirect to the path with its slash, after reading the whole body:
        # the view's limit applies to its slashless path too.
        try:
            match = resolve(path + "/")
        except Resolver404:
            return None
    if not hasattr(match.func, "webhook_max_bytes"):
        return None
    limit = match.func.webhook_max_bytes
    return int(limit) if limit is not None else int(inbox_settings.max_payload_bytes)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the view answers 400
    return None


async def _refuse(send: Send, status: int, reason: str) -> None:
    logger.info("webhook refused before its body was read (%s): %s", status, reason)
    body = json.dumps({"error": reason}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
