from __future__ import annotations

from argparse import BooleanOptionalAction
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...conf import inbox_settings
from ...consumer.loop import AckMode, BrokerConsumer, BrokerMisconfigured
from ...registry import registry
from ..base import add_metrics_option, add_stop_options, start_metrics
from .inbox_process import Command as ProcessCommand


class Command(ProcessCommand):
    help = (
        "Consume a broker queue into the inbox: each message is acknowledged only after the "
        "inbox committed it. Runs until stopped (SIGTERM/SIGINT: finish the current message, "
        "leave the rest unacknowledged for the broker to redeliver, exit 0; a second signal "
        "rolls back and exits 1). Exit codes: 0 stopped normally, 1 interrupted, "
        "2 misconfigured."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--consumer", required=True, help="The inbox consumer to feed.")
        parser.add_argument(
            "--queue", default=None, help="Queue to consume (default: the consumer's name)."
        )
        parser.add_argument(
            "--broker", default=None, help="kombu broker URL (default: INBOX_BROKER_URL)."
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
            type=int,
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
        parser.add_argument(
            "--commit-every",
            type=int,
            default=None,
            metavar="N",
            help=(
                "With --ack after-process, deliver up to N waiting messages in one transaction "
                "and ack them after its commit (default: the consumer's commit_every, "
                "INBOX_COMMIT_EVERY = 1). On a handler failure the batch is rerun one message "
                "per transaction."
            ),
        )
        add_stop_options(parser, "broker messages")
        add_metrics_option(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        consumer: str = options["consumer"]
        if consumer not in registry.consumers():
            raise CommandError(
                f"No handlers are registered for consumer {consumer!r}; known consumers: "
                f"{registry.consumers()!r}.",
                returncode=2,
            )
        broker = options["broker"] or inbox_settings.broker_url
        if not broker:
            raise CommandError(
                "No broker: pass --broker URL or set INBOX_BROKER_URL.", returncode=2
            )
        for name in ("prefetch", "max_messages", "commit_every"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(f"--{name.replace('_', '-')} must be at least 1.", returncode=2)
        worker = BrokerConsumer(
            consumer=consumer,
            queue=options["queue"] or consumer,
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
        )
        start_metrics(options["metrics_port"])
        try:
            with worker.shutdown.handling_signals():
                stats = worker.run()
        except BrokerMisconfigured as exc:
            raise CommandError(f"{exc}.", returncode=2) from None
        if options["verbosity"] >= 1:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "nothing"
            self.stdout.write(
                f"inbox_consume: acked {stats.acked} ({counts}), refused {stats.refused}, "
                f"requeued {stats.requeued}, reconnects {stats.reconnects}"
            )
