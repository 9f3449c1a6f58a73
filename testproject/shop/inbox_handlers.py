"""The demo shop's handlers, written the way the design shows."""

from django.db.models import F

from django_inbox import Reject, inbox_handler

from .models import Payment, Stock


class GatewayTimeout(Exception):
    """The payment provider did not answer; worth retrying."""


@inbox_handler("order.placed", consumer="inventory")
def reserve_stock(message):
    sku, qty = message.payload["sku"], message.payload["qty"]
    if qty <= 0:
        raise Reject("quantity must be positive")
    if not Stock.objects.filter(sku=sku).update(qty=F("qty") - qty):
        raise Reject(f"unknown SKU {sku!r}")


@inbox_handler("order.placed", consumer="payments")
def charge_card(message):
    amount = message.payload["amount_cents"]
    if amount <= 0:
        raise Reject("amount must be positive")
    # A flaky provider: this order's first attempts time out, then the charge goes through.
    if message.attempts <= message.payload.get("gateway_failures", 0):
        raise GatewayTimeout("payment gateway did not answer within 2s")
    # A real integration sends message.idempotency_key to the provider, so a retry after a
    # crash between the provider's charge and our commit is not charged twice.
    Payment.objects.create(
        order_id=message.payload["order_id"],
        amount_cents=amount,
        idempotency_key=message.idempotency_key,
    )
