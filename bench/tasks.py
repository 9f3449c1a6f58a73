"""The tasks of figure 11 (``bench/celery_tasks.py``): the benchmark handler's one-row UPDATE
as a plain ``@shared_task`` in ``transaction.atomic()``, and as an ``@inbox_task``. Both
``acks_late``, as at-least-once tasks are run."""

from celery import shared_task
from django.db import transaction
from django.db.models import F
from shop.models import Stock

from django_inbox.contrib.celery import inbox_task


@shared_task(
    name="bench.plain_take", acks_late=True, reject_on_worker_lost=True, ignore_result=True
)
def plain_take(sku: str) -> None:
    with transaction.atomic():
        Stock.objects.filter(sku=sku).update(qty=F("qty") - 1)


@inbox_task(
    consumer="bench-tasks",
    name="bench.inbox_take",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def inbox_take(sku: str) -> None:
    Stock.objects.filter(sku=sku).update(qty=F("qty") - 1)
