"""Signed webhooks straight into the inbox: :func:`webhook_view` with a verifier of the
sender's signature scheme (:class:`StandardWebhooks`, :class:`HmacSignature`,
:class:`StripeSignature`). See the how-to "Take signed webhooks"."""

from .asgi import webhook_body_limit
from .verify import HmacSignature, Signed, StandardWebhooks, StripeSignature, Unauthorized, Verifier
from .view import KEPT_HEADERS, webhook_view

__all__ = [
    "KEPT_HEADERS",
    "HmacSignature",
    "Signed",
    "StandardWebhooks",
    "StripeSignature",
    "Unauthorized",
    "Verifier",
    "webhook_body_limit",
    "webhook_view",
]
