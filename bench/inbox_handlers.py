"""The benchmark handler: one single-row UPDATE, the same statement every baseline runs."""

from django.db.models import F
from shop.models import Stock

from django_inbox import inbox_handler

CONSUMER = "bench"
EVENT_TYPE = "bench.take"
SKUS = 100  # rows the updates are spread over: BENCH-0 … BENCH-99


@inbox_handler(EVENT_TYPE, consumer=CONSUMER)
def take_one(message):
    Stock.objects.filter(sku=message.payload["sku"]).update(qty=F("qty") - 1)
