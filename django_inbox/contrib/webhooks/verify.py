"""How a webhook's sender signs it: Standard Webhooks, a plain HMAC header (GitHub and the like)
and Stripe's ``t=…,v1=…``. Each verifier checks a request's signature over its raw body in
constant time and says which message it is (:class:`Signed`); a request it refuses raises
:class:`Unauthorized` with the reason (never a secret, never the body)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: How far a signed timestamp may be from the receiver's clock, either way (seconds): the
#: five minutes Standard Webhooks and Stripe use.
TOLERANCE = 300.0


class Unauthorized(Exception):
    """The request's signature is missing, wrong, or too old or new (answered 401)."""


@dataclass(frozen=True)
class Signed:
    """What a verified request says about itself: its message id (``None``: take the body's
    ``id``) and event type (``None``: take the body's ``type``)."""

    message_id: str | None
    event_type: str | None = None


class Verifier:
    """Checks one request. ``headers`` are the request's, by lowercase name."""

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> Signed:
        raise NotImplementedError


def _secrets(secret: str | bytes | Sequence[str | bytes]) -> list[bytes]:
    """One secret or several (a rotation: any of them signs), as bytes."""
    found = [secret] if isinstance(secret, str | bytes) else list(secret)
    if not found or any(not value for value in found):
        raise ValueError("a webhook secret must not be empty")
    return [value.encode() if isinstance(value, str) else value for value in found]


def _within(timestamp: str, tolerance: float, now: float | None) -> None:
    # ASCII digits only: int() would also take " 1", "+1", "1_0" and other scripts' digits.
    if not (timestamp.isascii() and timestamp.isdigit() and len(timestamp) <= 12):
        raise Unauthorized("the signature's timestamp is not a number of seconds")
    signed_at = int(timestamp)
    if abs((time.time() if now is None else now) - signed_at) > tolerance:
        raise Unauthorized(f"the signature's timestamp is more than {tolerance:g}s away")


class StandardWebhooks(Verifier):
    """`Standard Webhooks <https://www.standardwebhooks.com>`_: ``webhook-id`` is the message
    id, ``webhook-timestamp`` the signing time (within ``tolerance`` seconds), and
    ``webhook-signature`` holds space-separated ``v1,<base64>`` signatures, HMAC-SHA256 with
    the secret over ``id.timestamp.body``; any one of them, by any of the secrets, will do.

    ``secret``: the sender's secret as it gives it (``whsec_`` and base64), or several during
    a rotation (the old and the new).
    """

    def __init__(
        self, secret: str | bytes | Sequence[str | bytes], *, tolerance: float = TOLERANCE
    ) -> None:
        self.keys = [self._key(value) for value in _secrets(secret)]
        self.tolerance = tolerance

    @staticmethod
    def _key(secret: bytes) -> bytes:
        text = secret.removeprefix(b"whsec_")
        try:
            return base64.b64decode(text, validate=True)
        except binascii.Error:
            raise ValueError("a Standard Webhooks secret is base64 (after 'whsec_')") from None

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> Signed:
        message_id = headers.get("webhook-id", "")
        timestamp = headers.get("webhook-timestamp", "")
        given = headers.get("webhook-signature", "")
        if not (message_id and timestamp and given):
            raise Unauthorized("webhook-id, webhook-timestamp and webhook-signature are required")
        _within(timestamp, self.tolerance, now)
        content = f"{message_id}.{timestamp}.".encode() + body
        expected = [
            base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()) for key in self.keys
        ]
        for entry in given.split():
            version, _, signature = entry.partition(",")
            if version != "v1":
                continue
            if any(hmac.compare_digest(signature.encode(), wanted) for wanted in expected):
                return Signed(message_id)
        raise Unauthorized("no v1 signature matches")


class HmacSignature(Verifier):
    """An HMAC-SHA256 of the raw body, hex, in ``header`` after ``prefix`` (GitHub:
    ``X-Hub-Signature-256``, ``sha256=``). The message id is in ``id_header`` (GitHub:
    ``X-GitHub-Delivery``), else the body's ``id``; the event type in ``event_type_header``
    (``X-GitHub-Event``), else the body's ``type``. Such signatures carry no time: a replayed
    request is a duplicate of its message id, which the inbox answers as one."""

    def __init__(
        self,
        *,
        secret: str | bytes | Sequence[str | bytes],
        header: str,
        prefix: str = "",
        id_header: str | None = None,
        event_type_header: str | None = None,
    ) -> None:
        self.keys = _secrets(secret)
        self.header = header.lower()
        self.prefix = prefix
        self.id_header = id_header.lower() if id_header else None
        self.event_type_header = event_type_header.lower() if event_type_header else None

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> Signed:
        given = headers.get(self.header, "")
        if not given.startswith(self.prefix) or len(given) == len(self.prefix):
            raise Unauthorized(f"{self.header} is missing or does not start with {self.prefix!r}")
        signature = given[len(self.prefix) :].strip().lower().encode()
        if not any(
            hmac.compare_digest(signature, hmac.new(key, body, hashlib.sha256).hexdigest().encode())
            for key in self.keys
        ):
            raise Unauthorized(f"the {self.header} signature does not match")
        message_id = headers.get(self.id_header) if self.id_header else None
        if self.id_header and not message_id:
            raise Unauthorized(f"{self.id_header} is required")
        event_type = headers.get(self.event_type_header) if self.event_type_header else None
        return Signed(message_id, event_type or None)


class StripeSignature(Verifier):
    """Stripe's ``Stripe-Signature: t=<unix time>,v1=<hex>[,v1=<hex>…]``: HMAC-SHA256 with the
    endpoint's signing secret (``whsec_…``, used as it is) over ``t.body``, the time within
    ``tolerance`` seconds. The message id is the event's ``id`` (``evt_…``), the event type
    its ``type``, both from the body."""

    header = "stripe-signature"

    def __init__(
        self, secret: str | bytes | Sequence[str | bytes], *, tolerance: float = TOLERANCE
    ) -> None:
        self.keys = _secrets(secret)
        self.tolerance = tolerance

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> Signed:
        fields = [part.partition("=") for part in headers.get(self.header, "").split(",")]
        timestamps = [value for name, _, value in fields if name.strip() == "t"]
        signatures = [
            value.strip().lower().encode() for name, _, value in fields if name.strip() == "v1"
        ]
        if len(timestamps) != 1 or not signatures:
            raise Unauthorized("Stripe-Signature needs one t= and a v1= signature")
        _within(timestamps[0], self.tolerance, now)
        content = timestamps[0].encode() + b"." + body
        expected = [
            hmac.new(key, content, hashlib.sha256).hexdigest().encode() for key in self.keys
        ]
        if not any(hmac.compare_digest(s, e) for s in signatures for e in expected):
            raise Unauthorized("no v1 signature matches")
        return Signed(None)
