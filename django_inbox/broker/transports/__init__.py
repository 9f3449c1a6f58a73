"""The brokers ``inbox_consume`` reads (see :mod:`.base` for the interface): kombu's
(RabbitMQ, Redis lists, SQS, filesystem, memory), NATS JetStream (``nats://``), Redis
Streams (``redis+streams://``) and SQS read natively (``sqs+native://``)."""

from __future__ import annotations

from importlib import import_module

from .base import Delivery, Received, Subscription, Transport

__all__ = ["Delivery", "Received", "Subscription", "Transport", "transport_class"]

#: URL scheme -> "module:class" of its transport (imported only when used: each broker's client
#: is an optional extra).
SCHEMES = {
    "nats": "nats:NatsTransport",
    "redis+streams": "redis_streams:RedisStreamsTransport",
    "rediss+streams": "redis_streams:RedisStreamsTransport",
    "sqs+native": "sqs:SqsTransport",
}


def transport_class(url: str) -> type[Transport]:
    """The transport for ``url``'s scheme; kombu's for every scheme not named in
    :data:`SCHEMES`. Raises ``ImportError`` when the broker's client is not installed."""
    scheme = url.split("://", 1)[0].lower()
    module, _, name = SCHEMES.get(scheme, "kombu:KombuTransport").partition(":")
    found: type[Transport] = getattr(import_module(f"{__name__}.{module}"), name)
    return found
