"""Figure 8: the outbox companion, same run, same machine.

- ``publish()`` inside a business transaction against the same transaction without it: the
  transaction updates one stock row (the benchmark's handler statement); with the outbox it
  also writes the outbox row. Interleaved A B A B, ``N`` transactions each.
- The floor of that cost: the same two transactions sent by raw psycopg (prepared statements,
  one ``UPDATE``, with and without the outbox's ``INSERT``), interleaved with them.
- The relay (``Relay.run()`` in this process, batches of 100, publisher confirms) publishing
  ``N`` pending rows to a RabbitMQ queue, against a plain kombu producer publishing the same
  messages with confirms (kombu's ``confirm_publish``: one confirm per message), interleaved.
- The relay's lag under a steady load: rows written at 1,000 per second (100 transactions of
  ten) for 10 seconds while ``manage.py outbox_relay`` runs; each row's time from
  ``created_at`` to ``sent_at``, p50 and p99.
"""

from __future__ import annotations

import json
import time
from typing import Any

from bench.config import BROKERS, RUNS, N, log
from bench.timing import Series, django_backend_pid, measuring, payload

QUEUE = "inbox-bench-outbox"


def _queue(declare: bool) -> None:
    from kombu import Connection, Queue

    with Connection(BROKERS["rabbitmq"]) as connection:
        queue = Queue(QUEUE, routing_key=QUEUE, durable=True)(connection.default_channel)
        if declare:
            queue.declare()
            queue.purge()
        else:
            queue.delete()


def _truncate_outbox() -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE django_inbox_outbox_outboxmessage")


def bench_outbox() -> dict[str, Series]:
    from django.db import connection, transaction
    from django.db.models import F
    from kombu import Connection
    from shop.models import Stock

    from django_inbox.outbox import publish
    from django_inbox.outbox.relay import Relay

    log(f"\n== 8. outbox: publish() in a transaction, relay vs kombu with confirms ({RUNS} runs)")
    series = {
        "outbox_bare_tx": Series(f"business transaction (one UPDATE), {N} transactions"),
        "outbox_publish": Series(f"the same transaction + publish(), {N} transactions"),
        "outbox_round_trip": Series(f"the same transaction + one SELECT 1, {N} transactions"),
        "outbox_raw_bare": Series(f"raw psycopg: the transaction, {N} transactions"),
        "outbox_raw_insert": Series(f"raw psycopg: the transaction + the outbox INSERT, {N}"),
        "outbox_relay": Series(f"relay: {N} rows published with confirms, marked sent"),
        "outbox_kombu": Series(f"plain kombu producer with confirms, {N} messages"),
    }
    backend = django_backend_pid()
    _queue(declare=True)

    def business(i: int, extra: str) -> None:
        body = payload(i)
        with transaction.atomic():
            Stock.objects.filter(sku=body["sku"]).update(qty=F("qty") - 1)
            if extra == "publish":
                publish("bench.taken", body, routing_key=QUEUE, key=body["sku"])
            elif extra == "round trip":  # the least any statement of publish()'s costs
                with connection.cursor() as cursor:
                    cursor.execute("SELECT 1")

    raw = _raw_floor()
    try:
        for _ in range(RUNS):
            for name, with_insert in (("outbox_raw_bare", False), ("outbox_raw_insert", True)):
                _truncate_outbox()
                raw(10**8, 200, with_insert)
                _truncate_outbox()
                with measuring(series[name], N, None):
                    raw(0, N, with_insert)
            for name, extra in (
                ("outbox_bare_tx", ""),
                ("outbox_round_trip", "round trip"),
                ("outbox_publish", "publish"),  # last: its rows are what the relay sends
            ):
                _truncate_outbox()
                for i in range(200):  # warm up
                    business(10**8 + i, extra)
                _truncate_outbox()
                with measuring(series[name], N, backend):
                    for i in range(N):
                        business(i, extra)
            # The rows the publish() run left are what the relay sends.
            relay = Relay(BROKERS["rabbitmq"], until_idle=0, poll_interval=0.01, batch_size=100)
            with measuring(series["outbox_relay"], N, backend):
                stats = relay.run()
            if stats.sent != N:
                raise RuntimeError(f"relay sent {stats.sent} of {N}")
            with Connection(
                BROKERS["rabbitmq"], transport_options={"confirm_publish": True}
            ) as broker:
                producer = broker.Producer()
                bodies = [json.dumps(payload(i)) for i in range(N)]
                with measuring(series["outbox_kombu"], N, None):
                    for i, body in enumerate(bodies):
                        producer.publish(
                            body, routing_key=QUEUE, content_type="application/json",
                            content_encoding="utf-8", message_id=f"k{i}", type="bench.taken",
                            delivery_mode=2, mandatory=True,
                        )  # fmt: skip
            _queue(declare=True)  # empty it
            rate = {name: f"{one.rates[-1]:7.0f}" for name, one in series.items()}
            log(
                f"   bare tx {rate['outbox_bare_tx']}, + SELECT 1 {rate['outbox_round_trip']}, "
                f"+ publish {rate['outbox_publish']} (raw {rate['outbox_raw_bare']}, + INSERT "
                f"{rate['outbox_raw_insert']}), relay {rate['outbox_relay']}, kombu "
                f"{rate['outbox_kombu']} /s"
            )
        series["outbox_relay"].extra.update(lag())
    finally:
        _truncate_outbox()
        _queue(declare=False)
    return series


def _raw_floor() -> Any:
    """A function running ``count`` raw psycopg transactions from ``start``: the benchmark's
    UPDATE, and with ``insert`` the row ``publish()`` writes, both prepared."""
    import uuid

    import psycopg

    from bench.config import BENCH_DSN

    connection = psycopg.connect(BENCH_DSN, prepare_threshold=0)
    cursor = connection.cursor()
    update = 'UPDATE "shop_stock" SET "qty" = "qty" - 1 WHERE "sku" = %s'
    insert = (
        'INSERT INTO "django_inbox_outbox_outboxmessage" ("message_id", "event_type", '
        '"payload", "headers", "exchange", "routing_key", "key", "status", "attempts", '
        '"last_error", "created_at", "updated_at", "next_attempt_at", "lease_id", '
        '"causation_consumer", "causation_message_id") VALUES (%s, %s, %s::jsonb, '
        "'{}'::jsonb, '', %s, %s, 'pending', 0, '', now(), now(), CASE WHEN NOT EXISTS "
        '(SELECT 1 FROM (SELECT e."key" FROM "django_inbox_outbox_outboxmessage" e WHERE '
        """e."status" = 'pending' AND e."key" <> '' AND e."key" >= %s ORDER BY e."key", e."id" """
        "LIMIT 1) next WHERE next.\"key\" = %s) THEN now() END, '', '', '') RETURNING CASE "
        'WHEN "next_attempt_at" IS NULL THEN NOT EXISTS (SELECT 1 FROM (SELECT e."key", e.xmin '
        """FROM "django_inbox_outbox_outboxmessage" e WHERE e."status" = 'pending' AND e."key" """
        """<> '' AND e."key" >= %s ORDER BY e."key", e."id" LIMIT 1) head WHERE head."key" = %s """
        'AND head.xmin = "django_inbox_outbox_outboxmessage".xmin) END'
    )  # as publish() writes it: held behind an earlier pending row of its key, and whether
    # the row holding it is of another transaction

    def run(start: int, count: int, with_insert: bool) -> None:
        for i in range(start, start + count):
            body = payload(i)
            cursor.execute(update, [body["sku"]])
            if with_insert:
                cursor.execute(
                    insert,
                    [
                        str(uuid.uuid4()),
                        "bench.taken",
                        json.dumps(body),
                        QUEUE,
                        body["sku"],
                        body["sku"],
                        body["sku"],
                        body["sku"],
                        body["sku"],
                    ],
                )
                cursor.fetchone()
            connection.commit()

    return run


def lag(rate: int = 1000, seconds: float = 10.0) -> dict[str, float]:
    """Write ``rate`` rows a second (100 transactions of ten) for ``seconds`` while a relay
    runs (``manage.py outbox_relay``, a process of its own); the rows' time from written to
    sent (ms), p50 and p99."""
    import subprocess
    import sys

    from django.db import transaction

    from bench.config import MANAGE
    from bench.drain import subprocess_env
    from django_inbox.outbox import publish
    from django_inbox.outbox.models import OutboxMessage

    _truncate_outbox()
    relay = subprocess.Popen(
        [sys.executable, str(MANAGE), "outbox_relay", "--broker", BROKERS["rabbitmq"],
         "--poll-interval", "0.01", "--verbosity", "0"],
        env=subprocess_env(),
    )  # fmt: skip
    try:
        ready = publish("bench.lag", {"i": -1}, routing_key=QUEUE)  # the relay has started
        deadline = time.monotonic() + 60
        while not OutboxMessage.objects.filter(message_id=ready, status="sent").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("lag: the relay did not start")
            time.sleep(0.05)
        _truncate_outbox()
        total = int(rate * seconds)
        per_transaction = 10
        started = time.perf_counter()
        for i in range(0, total, per_transaction):
            with transaction.atomic():
                for j in range(i, min(i + per_transaction, total)):
                    publish("bench.lag", {"i": j}, routing_key=QUEUE)
            pause = started + (i + per_transaction) / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
        written_for = time.perf_counter() - started
        deadline = time.monotonic() + 60
        pending = OutboxMessage.objects.filter(status="pending")
        while pending.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        relay.terminate()
        relay.wait(timeout=30)
    delays = sorted(
        (sent - created).total_seconds() * 1000
        for created, sent in OutboxMessage.objects.values_list("created_at", "sent_at")
        if sent is not None
    )
    if len(delays) < total:
        raise RuntimeError(f"lag: {len(delays)} of {total} rows sent")
    result = {
        "lag_rate": round(total / written_for, 1),
        "lag_p50_ms": round(delays[len(delays) // 2], 1),
        "lag_p99_ms": round(delays[int(len(delays) * 0.99) - 1], 1),
    }
    log(
        f"   relay lag at {result['lag_rate']:.0f} rows/s written: p50 {result['lag_p50_ms']} ms, "
        f"p99 {result['lag_p99_ms']} ms"
    )
    return result
