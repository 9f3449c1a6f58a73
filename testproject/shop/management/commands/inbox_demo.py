"""Feed a realistic order stream through the inbox and show what it did.

The stream is what an at-least-once broker hands a shop: about 30% of messages arrive more
than once, the payment gateway times out now and then, and a few messages are poison.
Each message goes to two consumers, the way a fan-out exchange delivers to two queues:
``inventory`` processes inline with ``deliver()``; ``payments`` acknowledges after
``store()`` and a worker processes it (the ``inbox_process`` loop, run in this process).
"""

from __future__ import annotations

import json
import logging
import random
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count, Sum
from kombu import Connection, Queue

from django_inbox.broker.connection import AckMode, BrokerConsumer, ConsumeStats
from django_inbox.models import InboxMessage
from django_inbox.processing.worker import Worker
from shop.models import Payment, Stock

SKUS = ["MUG-01", "TEE-02", "CAP-03", "PEN-04", "BAG-05"]
QUEUES = {"inventory": "demo.inventory", "payments": "demo.payments"}
START_QTY = 100_000


def build_stream(
    total: int, rng: random.Random
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Return (deliveries in arrival order, the unique orders behind them)."""
    unique = round(total * 0.7)
    orders = []
    for n in range(unique):
        order: dict[str, Any] = {
            "id": f"ord-{n:05d}",
            "type": "order.placed",
            "payload": {
                "order_id": f"ord-{n:05d}",
                "sku": rng.choice(SKUS),
                "qty": rng.randint(1, 3),
                "amount_cents": rng.randint(500, 9_000),
            },
        }
        roll = rng.random()
        if roll < 0.06:
            order["payload"]["gateway_failures"] = rng.randint(1, 2)  # transient
        orders.append(order)
    # A few poison messages, placed at random.
    poison = rng.sample(range(unique), 8)
    orders[poison[0]]["payload"]["qty"] = 0  # rejected by inventory
    orders[poison[1]]["payload"]["qty"] = -2
    orders[poison[2]]["payload"]["sku"] = "GONE-99"  # unknown SKU: rejected
    orders[poison[3]]["payload"]["amount_cents"] = 0  # rejected by payments
    del orders[poison[4]]["payload"]["sku"]  # a producer bug: retried, then dead
    orders[poison[5]]["payload"]["gateway_failures"] = 99  # gateway never answers: dead
    orders[poison[6]]["type"] = "order.refunded"  # nobody handles it yet: kept dead
    orders[poison[7]]["type"] = "order.refunded"

    deliveries = list(orders)
    for _ in range(total - unique):  # redeliveries, producer retries, replays
        deliveries.append(rng.choice(orders))
    rng.shuffle(deliveries)
    return deliveries, orders


class Command(BaseCommand):
    help = (
        "Run the demo: publish a stream of orders with duplicates, flaky payments and poison "
        "messages to the broker (INBOX_BROKER_URL; the embedded filesystem broker by "
        "default), consume it with inbox_consume until idle, and print what happened."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--messages",
            type=int,
            default=1000,
            help="Broker messages in the stream, redelivered copies included (default 1000).",
        )
        parser.add_argument(
            "--seed",
            type=int,
            default=7,
            help="Seed of the random stream: the same seed gives the same run (default 7).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["verbosity"] < 2:
            logging.getLogger("django_inbox").setLevel(logging.CRITICAL)
        rng = random.Random(options["seed"])
        InboxMessage.objects.all().delete()
        Payment.objects.all().delete()
        Stock.objects.all().delete()
        Stock.objects.bulk_create(Stock(sku=sku, qty=START_QTY) for sku in SKUS)
        broker, options_ = _broker()

        deliveries, orders = build_stream(options["messages"], rng)
        published = _publish(broker, options_, deliveries)
        self.stdout.write(
            f"Published {published} messages to each of the queues "
            f"{' and '.join(QUEUES.values())} at {broker} "
            f"({len(orders)} unique orders, {len(deliveries) - len(orders)} redelivered "
            "copies, 1 message without an id, 1 undecodable body)."
        )
        consumed = {}
        for consumer, ack in (
            ("inventory", AckMode.AFTER_PROCESS),
            ("payments", AckMode.AFTER_STORE),
        ):
            self.stdout.write(
                f"$ manage.py inbox_consume --consumer {consumer} --queue {QUEUES[consumer]} "
                f"--ack {ack} --until-idle 1"
            )
            consumed[consumer] = BrokerConsumer(
                consumer=consumer,
                queue=QUEUES[consumer],
                broker_url=broker,
                transport_options=options_,
                ack_mode=ack,
                until_idle=1.0,
            ).run()
        self.stdout.write("$ manage.py inbox_process --until-idle 1    # stored payments, retries")
        stats = Worker(["inventory", "payments"], until_idle=1.0, poll_interval=0.05).run()
        self._report(published, orders, consumed, stats.outcomes)

    def _report(
        self,
        published: int,
        orders: list[dict[str, Any]],
        consumed: dict[str, ConsumeStats],
        worker: Counter[str],
    ) -> None:
        rows = InboxMessage.objects
        inventory, payments = consumed["inventory"], consumed["payments"]
        stored = {name: rows.filter(consumer=name).count() for name in consumed}
        table = [
            ("broker messages consumed", inventory.received, payments.received),
            ("refused at the broker (no message id)", inventory.refused, payments.refused),
            (
                "redeliveries recognised (not run again)",
                inventory.acked - stored["inventory"],
                payments.acked - stored["payments"],
            ),
            ("unique messages stored", stored["inventory"], stored["payments"]),
            *(
                (
                    label,
                    rows.filter(consumer="inventory", **query).count(),
                    rows.filter(consumer="payments", **query).count(),
                )
                for label, query in [
                    ("completed", {"status": "completed"}),
                    ("  of them after retries", {"status": "completed", "attempts__gt": 1}),
                    ("dead (kept with the reason)", {"status": "dead"}),
                    ("still pending", {"status__in": ["received", "failed", "in_progress"]}),
                ]
            ),
        ]
        self.stdout.write("")
        self.stdout.write(f"{'':38}{'inventory':>12}{'payments':>12}")
        for label, left, right in table:
            self.stdout.write(f"{label:38}{left:>12}{right:>12}")
        self.stdout.write("")

        self.stdout.write("Dead messages and why:")
        dead = (
            rows.filter(status="dead")
            .values("consumer", "last_error")
            .annotate(n=Count("id"))
            .order_by("consumer", "last_error")
        )
        for entry in dead:
            reason = _shorten(entry["last_error"], 90)
            self.stdout.write(f"  {entry['consumer']:10} {entry['n']:>3} x {reason}")
        self.stdout.write("")

        reserved = START_QTY * len(SKUS) - (Stock.objects.aggregate(total=Sum("qty"))["total"] or 0)
        completed_orders = set(
            rows.filter(consumer="inventory", status="completed").values_list(
                "message_id", flat=True
            )
        )
        expected_qty = sum(o["payload"]["qty"] for o in orders if o["id"] in completed_orders)
        charges = Counter(Payment.objects.values_list("order_id", flat=True))
        paid = set(
            rows.filter(consumer="payments", status="completed").values_list(
                "message_id", flat=True
            )
        )
        doubled = sum(1 for n in charges.values() if n > 1)
        lost = len(paid - set(charges))
        self.stdout.write("Checks against the business tables:")
        self.stdout.write(
            f"  stock reserved {reserved} units; completed inventory messages ask for "
            f"{expected_qty}: {'OK' if reserved == expected_qty else 'MISMATCH'}"
        )
        verdict = "OK" if not doubled and not lost else "MISMATCH"
        self.stdout.write(
            f"  {len(charges)} orders charged for {len(paid)} completed payment messages: "
            f"doubled charges {doubled}, lost {lost}: {verdict}"
        )
        runs = ", ".join(f"{n} {outcome}" for outcome, n in sorted(worker.items())) or "nothing"
        self.stdout.write(f"  the worker ran {sum(worker.values())} attempts: {runs}")
        self.stdout.write("")
        self.stdout.write(
            "Every duplicate was skipped by the database's unique (consumer, message_id) key, "
            "in the same transaction as the effect."
        )


def _shorten(text: str, width: int) -> str:
    """``text`` cut at a word boundary before ``width`` characters, an ellipsis marking it."""
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0]
    return cut.rstrip(" ,:;") + "…"


def _broker() -> tuple[str, dict[str, Any]]:
    """The broker and its options; the embedded filesystem broker's folders made empty."""
    url = settings.INBOX_BROKER_URL
    options = dict(settings.INBOX_BROKER_TRANSPORT_OPTIONS)
    if url.startswith("filesystem"):
        for key in ("data_folder_in", "data_folder_out", "control_folder"):
            folder = Path(options[key])
            folder.mkdir(parents=True, exist_ok=True)
            for leftover in folder.iterdir():
                leftover.unlink()
    return url, options


def _publish(url: str, options: dict[str, Any], deliveries: list[dict[str, Any]]) -> int:
    """Publish the stream to both queues, as a fan-out exchange would; return the count."""
    broken = [
        (b'{"order_id": "ord-x", "sku": "MUG-01"}', {}),  # a producer forgot the id
        (b"\xff\xfe\x00garbled", {"message_id": "garbled-1", "type": "order.placed"}),
    ]
    with Connection(url, transport_options=options) as connection:
        producer = connection.Producer()
        queues = [Queue(name, routing_key=name, durable=True) for name in QUEUES.values()]
        for queue in queues:
            queue(connection.default_channel).declare()
            queue(connection.default_channel).purge()
        for queue in queues:
            for message in deliveries:
                producer.publish(
                    json.dumps(message["payload"]),
                    routing_key=queue.name,
                    content_type="application/json",
                    content_encoding="utf-8",
                    message_id=message["id"],
                    type=message["type"],
                    app_id="orders",
                )
            for body, properties in broken:
                producer.publish(
                    body,
                    routing_key=queue.name,
                    content_type="application/json",
                    content_encoding="utf-8",
                    **properties,
                )
    return len(deliveries) + len(broken)
