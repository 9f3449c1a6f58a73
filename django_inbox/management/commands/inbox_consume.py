from __future__ import annotations

import sys
from argparse import BooleanOptionalAction
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...conf import inbox_settings
from ...services import (
    AckMode,
    BrokerConsumer,
    BrokerMisconfigured,
    BrokerUnreachable,
    ConsumeStats,
    DatabaseMisconfigured,
)
from ..base import (
    MISCONFIGURED,
    SHORT_MAX,
    InboxCommand,
    add_commit_every_option,
    add_metrics_option,
    add_stop_options,
    count,
    require_known_consumers,
    start_metrics,
)
from ..broker_options import (
    OWN_SCHEMES,
    add_wait_for_broker_option,
    amqp_name,
    checked_broker_url,
)


class Command(InboxCommand):
    help = (
        "Consume a broker queue into the inbox: each message is acknowledged only after the "
        "inbox committed it. Runs until stopped (SIGTERM/SIGINT: finish the current message, "
        "leave the rest unacknowledged for the broker to redeliver, exit 0; a second signal "
        "rolls back and exits 1). A lost broker or database is waited for. Exit codes: "
        "0 stopped normally, 1 interrupted, 2 misconfigured (unknown consumer, bad broker URL, "
        "broker refusing the queue or never reached, inbox table missing)."
    )
    waits_for_database = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--consumer", required=True, help="The inbox consumer to feed.")
        parser.add_argument(
            "--queue",
            required=True,
            help=(
                "The broker queue to consume. Declared (durable) if it does not exist, unless "
                "--no-declare: check its name, a typo consumes an empty new queue."
            ),
        )
        parser.add_argument(
            "--broker",
            default=None,
            help=(
                "Broker URL (default: INBOX_BROKER_URL): kombu's (amqp://, redis://, sqs://, "
                "filesystem://), nats:// (JetStream: --queue is the subject) or "
                "redis+streams:// (--queue is the stream)."
            ),
        )
        parser.add_argument(
            "--ack",
            choices=[mode.value for mode in AckMode],
            default=AckMode.AFTER_PROCESS.value,
            help=(
                "after-process (default): run the handler, commit, then ack. after-store: "
                "store, commit, ack; inbox_process workers run the handlers."
            ),
        )
        parser.add_argument(
            "--prefetch",
            type=count(1, SHORT_MAX),
            default=None,
            help="Unacked messages in flight (INBOX_PREFETCH).",
        )
        parser.add_argument("--exchange", default=None, help="Bind the queue to this exchange.")
        parser.add_argument(
            "--exchange-type",
            default="direct",
            choices=["direct", "topic", "fanout", "headers"],
            help="Type of --exchange when declaring it.",
        )
        parser.add_argument(
            "--routing-key", default=None, help="Binding key (default: the queue name)."
        )
        parser.add_argument(
            "--no-declare",
            action="store_true",
            help="Declare nothing: the queue, exchange and binding exist already.",
        )
        parser.add_argument(
            "--process-due",
            action=BooleanOptionalAction,
            default=None,
            help=(
                "Also run this consumer's due retries and abandoned rows between messages "
                "(default: on with --ack after-process, off with after-store)."
            ),
        )
        add_commit_every_option(
            parser,
            (
                "With --ack after-process, deliver up to N waiting messages in one transaction "
                "and ack them after its commit (default: the consumer's commit_every, "
                "INBOX_COMMIT_EVERY = 1). On a handler failure the batch is rerun one message "
                "per transaction."
            ),
        )
        add_wait_for_broker_option(parser)
        add_stop_options(parser, "broker messages")
        add_metrics_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        consumer: str = options["consumer"]
        require_known_consumers([consumer], with_handlers=True)
        if options["broker"] is not None and not options["broker"].strip():
            raise CommandError("--broker is empty.", returncode=MISCONFIGURED)
        broker = options["broker"] or inbox_settings.broker_url
        if not broker:
            raise CommandError(
                "No broker: pass --broker URL or set INBOX_BROKER_URL.", returncode=MISCONFIGURED
            )
        masked = checked_broker_url(broker)
        if options["commit_every"] is not None and options["ack"] == "after-store":
            raise CommandError(
                "--commit-every groups handlers' transactions: it goes with --ack after-process.",
                returncode=MISCONFIGURED,
            )
        for option in ("queue", "exchange", "routing_key"):
            amqp_name(f"--{option.replace('_', '-')}", options[option], empty=option != "queue")
        scheme = broker.split("://", 1)[0].lower()
        if scheme in OWN_SCHEMES and (options["exchange"] or options["routing_key"]):
            raise CommandError(
                f"--exchange and --routing-key bind AMQP queues; a {scheme}:// broker has none "
                "(its --queue names what is consumed).",
                returncode=MISCONFIGURED,
            )
        verbosity = options["verbosity"]
        worker = BrokerConsumer(
            consumer=consumer,
            queue=options["queue"],
            broker_url=broker,
            transport_options=inbox_settings.broker_transport_options,
            exchange=options["exchange"],
            exchange_type=options["exchange_type"],
            routing_key=options["routing_key"],
            declare=not options["no_declare"],
            prefetch=options["prefetch"] or inbox_settings.prefetch,
            ack_mode=AckMode(options["ack"]),
            process_due=options["process_due"],
            commit_every=options["commit_every"],
            max_messages=options["max_messages"],
            until_idle=options["until_idle"],
            wait_for_broker=options["wait_for_broker"] or None,
            on_message_done=self._print_message if verbosity >= 2 else None,
        )
        if verbosity >= 1:
            self.stderr.write(start_line(worker, masked))
        start_metrics(options["metrics_port"])
        try:
            with worker.shutdown.handling_signals():
                stats = worker.run()
        except (BrokerMisconfigured, BrokerUnreachable) as exc:
            raise CommandError(f"{exc}.", returncode=MISCONFIGURED) from None
        except DatabaseMisconfigured as exc:
            raise CommandError(str(exc), returncode=MISCONFIGURED) from None
        if verbosity >= 1:
            self.stdout.write(summary(stats))

    def _print_message(self, message_id: str | None, outcome: str, seconds: float) -> None:
        self.stdout.write(f"{message_id or '(no id)'} {outcome} in {seconds * 1000:.1f} ms")
        sys.stdout.flush()


def start_line(worker: BrokerConsumer, masked_url: str) -> str:
    """What the consumer is about to do, said once on start (never a password)."""
    return (
        f"inbox_consume: consumer {worker.consumer!r}, {worker.transport().describe()}, "
        f"broker {masked_url}; ack {worker.ack_mode.value}, prefetch {worker.prefetch}, "
        f"commit every {worker.commit_every}"
    )


def summary(stats: ConsumeStats) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "nothing"
    unreadable = f", unreadable {stats.unreadable}" if stats.unreadable else ""
    return (
        f"inbox_consume: acked {stats.acked} ({counts}), refused {stats.refused}, "
        f"requeued {stats.requeued}, reconnects {stats.reconnects}{unreadable}"
    )
