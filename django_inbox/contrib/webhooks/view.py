"""``webhook_view()``: a signed webhook straight into the inbox.

Per request: POST only (405); the body read up to the payload limit and no further (413);
the signature checked over the raw body (401); the body decoded as a JSON object with an
event type and a message id (400); then ``store()`` (202, workers process it) or
``deliver()`` (200, processed inline), and 200 for a resend of a message the inbox has. Nothing
is stored for a 4xx, bad input is never a 5xx, and neither the body nor a secret is logged. A
database that does not answer is 503, so that the sender tries again later.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from django.db import DatabaseError, connections, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError

from ...conf import inbox_settings
from ...exceptions import InvalidMessage, PayloadTooLarge, UnknownEventType
from ...outcomes import Outcome
from .verify import Signed, Unauthorized, Verifier

logger = logging.getLogger("django_inbox.webhooks")

#: Headers kept on the row by default: the sender's trace context.
KEPT_HEADERS = ("traceparent", "tracestate")


class Refused(Exception):
    """A request answered with a 4xx: nothing stored."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def webhook_view(
    *,
    consumer: str,
    verify: Verifier,
    mode: Literal["store", "deliver"] = "store",
    max_bytes: int | None = None,
    keep_headers: Sequence[str] = KEPT_HEADERS,
    asynchronous: bool = False,
) -> Callable[..., Any]:
    """A view that takes ``consumer``'s messages from a webhook sender.

    ``verify``: the sender's signature scheme (:class:`StandardWebhooks`,
    :class:`HmacSignature`, :class:`StripeSignature`). ``mode``: ``"store"`` answers as soon
    as the message is stored (workers process it), ``"deliver"`` processes it inline first.
    ``max_bytes``: the largest body taken (``INBOX_MAX_PAYLOAD_BYTES`` by default).
    ``keep_headers``: request headers stored with the message, by name. ``asynchronous``: an
    ``async def`` view (for ASGI servers: no thread is held while the request waits for the
    database), which stores with :func:`~django_inbox.astore` and processes with
    :func:`~django_inbox.adeliver`; the answers are the same.

    Under ASGI, Django reads a request's whole body before any view runs: wrap the
    application in :func:`~django_inbox.contrib.webhooks.asgi.webhook_body_limit` so a body
    over the limit is refused before it is read.
    """
    if mode not in ("store", "deliver"):
        raise ValueError(f"mode must be 'store' or 'deliver', not {mode!r}")
    kept = tuple(name.lower() for name in keep_headers)

    def prepare(request: HttpRequest) -> dict[str, Any]:
        """The message a request carries, or :class:`Refused`."""
        if request.method != "POST":
            raise Refused(405, "POST only")
        limit = max_bytes if max_bytes is not None else inbox_settings.max_payload_bytes
        body = _read(request, limit)
        headers = _Headers(request.headers)
        try:
            signed = verify.verify(headers, body)
        except Unauthorized as exc:
            raise Refused(401, str(exc)) from None
        return _message(body, signed, consumer, headers, kept)

    view: Callable[..., Any]
    if asynchronous:

        async def async_view(request: HttpRequest) -> HttpResponse:
            try:
                return await _atake(prepare(request), mode)
            except Refused as exc:
                return _refusal(consumer, exc)

        view = async_view
    else:

        def sync_view(request: HttpRequest) -> HttpResponse:
            try:
                return _take(prepare(request), mode)
            except Refused as exc:
                return _refusal(consumer, exc)

        view = sync_view

    view.__name__ = view.__qualname__ = f"webhook_view_{consumer}"
    # Senders sign their requests; they have no CSRF token. (The attribute, not the
    # decorator: on Django 4.2 the decorator hides that the view is a coroutine function.)
    # webhook_body_limit() reads webhook_max_bytes (None: INBOX_MAX_PAYLOAD_BYTES).
    vars(view).update(csrf_exempt=True, webhook_max_bytes=max_bytes)
    # The inbox commits its own transactions: ATOMIC_REQUESTS must not wrap them in the
    # request's (a message would be answered stored before it is committed), on any database.
    for alias in connections:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


def _refusal(consumer: str, exc: Refused) -> HttpResponse:
    logger.info("webhook for %s refused (%s): %s", consumer, exc.status, exc.reason)
    response = JsonResponse({"error": exc.reason}, status=exc.status)
    if exc.status == 405:
        response["Allow"] = "POST"
    return response


class _Headers(Mapping[str, str]):
    """A request's headers by name in any case, each value as the sender wrote it
    (:func:`_text`), converted only when read: a verifier reads three or four of them."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = headers  # Django's HttpHeaders: names in any case

    def __getitem__(self, name: str) -> str:
        return _text(self._headers[name])

    def __contains__(self, name: object) -> bool:
        return name in self._headers

    def __iter__(self) -> Iterator[str]:
        return (name.lower() for name in self._headers)

    def __len__(self) -> int:
        return len(self._headers)


def _text(value: str) -> str:
    """A header's value as the sender wrote it: servers hand headers over decoded as Latin-1
    (as WSGI and ASGI say), so a UTF-8 id such as ``évt_1`` arrives as ``Ã©vt_1``; its bytes
    are UTF-8 again here, and a signature over them matches. A value that is not UTF-8 stays
    as the server gave it."""
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:
        return value


def _read(request: HttpRequest, limit: int) -> bytes:
    """The body, never more than ``limit`` bytes of it read."""
    given = str(request.META.get("CONTENT_LENGTH") or "0").strip()
    if given.startswith("-"):
        raise Refused(400, "Content-Length is negative")
    if not (given.isascii() and given.isdigit()):  # int() would take "+5" and "1_0"
        raise Refused(400, "Content-Length is not a number")
    if int(given) > limit:
        raise Refused(413, f"the body is larger than {limit} bytes")
    try:
        body = request.read(limit + 1)
    except UnreadablePostError:  # the sender went away mid-body: nobody reads the answer
        raise Refused(400, "the body could not be read (the sender went away)") from None
    if len(body) > limit:
        raise Refused(413, f"the body is larger than {limit} bytes")
    return body


def _message(
    body: bytes, signed: Signed, consumer: str, headers: Mapping[str, str], kept: tuple[str, ...]
) -> dict[str, Any]:
    """The inbox message a verified body makes, or :class:`Refused` (400)."""
    try:
        payload = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise Refused(400, "the body is not UTF-8") from None
    except ValueError:
        raise Refused(400, "the body is not JSON") from None
    except RecursionError:  # nested deeper than Python's parser goes (~1,000 levels)
        raise Refused(400, "the body is nested too deeply") from None
    found = payload if isinstance(payload, dict) else {}
    event_type = signed.event_type or found.get("type")
    if not isinstance(event_type, str) or not event_type:
        raise Refused(400, "no event type (a header of the sender's, or the body's 'type')")
    message_id = signed.message_id or found.get("id")
    if isinstance(message_id, int) and not isinstance(message_id, bool):
        message_id = str(message_id)
    if not isinstance(message_id, str) or not message_id:
        raise Refused(400, "no message id (a header of the sender's, or the body's 'id')")
    return {
        "consumer": consumer,
        "message_id": message_id,
        "event_type": event_type,
        "payload": payload,
        "headers": {name: headers[name] for name in kept if name in headers},
        "source": "webhook",
    }


def _take(message: dict[str, Any], mode: str) -> HttpResponse:
    from ...intake import delivery, storing

    try:
        if mode == "store":
            return _stored(storing.store(**message))
        return _delivered(delivery.deliver(**message))
    except Exception as exc:
        return _failed(message, exc)


async def _atake(message: dict[str, Any], mode: str) -> HttpResponse:
    from ...intake import asynchronous

    try:
        if mode == "store":
            return _stored(await asynchronous.astore(**message))
        return _delivered(await asynchronous.adeliver(**message))
    except Exception as exc:
        return _failed(message, exc)


#: The answers to a stored message and to a resend, made once.
_STORED = json.dumps({"stored": True, "duplicate": False}).encode()
_DUPLICATE = json.dumps({"stored": False, "duplicate": True}).encode()


def _stored(new: bool) -> HttpResponse:
    if new:
        return HttpResponse(_STORED, status=202, content_type="application/json")
    return HttpResponse(_DUPLICATE, status=200, content_type="application/json")


def _delivered(outcome: Outcome) -> HttpResponse:
    status = 202 if outcome in (Outcome.IN_PROGRESS,) else 200
    return JsonResponse({"outcome": outcome.value}, status=status)


def _failed(message: dict[str, Any], exc: Exception) -> HttpResponse:
    """The answer to what ``store()``/``deliver()`` raised: 413 or 400 for a message the inbox
    refuses, 503 for a database that did not answer (the sender tries again); anything else is
    the service's own fault and propagates (500, and the sender tries again)."""
    if isinstance(exc, PayloadTooLarge):
        raise Refused(413, str(exc)) from None
    if isinstance(exc, InvalidMessage | UnknownEventType):
        raise Refused(400, str(exc)) from None
    if isinstance(exc, DatabaseError):
        logger.warning(
            "webhook for %s: the database did not take it (%s)", message["consumer"], exc
        )
        return JsonResponse({"error": "the database is not available; try again"}, status=503)
    raise exc
