from django.db import models


class Stock(models.Model):
    sku = models.CharField(max_length=50, unique=True)
    qty = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.sku}: {self.qty}"


class Payment(models.Model):
    """One row per charge. No unique constraint: only the inbox stands between a
    redelivered message and a double charge."""

    order_id = models.CharField(max_length=50)
    amount_cents = models.IntegerField()
    idempotency_key = models.CharField(max_length=80)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.order_id}: {self.amount_cents}"
