"""The benchmark handler: one single-row UPDATE, the same statement every baseline runs."""

from django.db.models import F
from shop.models import Stock

from django_inbox import inbox_handler

CONSUMER = "bench"
EVENT_TYPE = "bench.take"


@inbox_handler(EVENT_TYPE, consumer=CONSUMER)
def take_one(message):
    Stock.objects.filter(sku=message.payload["sku"]).update(qty=F("qty") - 1)


NOOP_CONSUMER = "bench-noop"
NOOP_EVENT_TYPE = "bench.noop"


@inbox_handler(NOOP_EVENT_TYPE, consumer=NOOP_CONSUMER)
def nothing(message):
    """An empty handler: what the inbox costs on its own."""


ORDERED_CONSUMER = "bench-ordered"


@inbox_handler(EVENT_TYPE, consumer=ORDERED_CONSUMER)
def take_one_in_order(message):
    """The benchmark handler in an ordered consumer (``bench.settings``)."""
    Stock.objects.filter(sku=message.payload["sku"]).update(qty=F("qty") - 1)
