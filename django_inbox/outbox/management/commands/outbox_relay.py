from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ....conf import inbox_settings
from ....management.base import MISCONFIGURED, InboxCommand, add_stop_options, seconds
from ...relay import Relay


class Command(InboxCommand):
    help = (
        "Publish the outbox: claim pending rows (a key's oldest first, SKIP LOCKED so several "
        "relays share the work), publish them to the AMQP broker with publisher confirms "
        "(persistent, mandatory), and mark them sent once confirmed. Runs until stopped "
        "(SIGTERM/SIGINT: finish the batch, exit 0; a second signal exits 1). Exit codes: 0 "
        "stopped normally, 1 interrupted, 2 misconfigured."
    )

    waits_for_database = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--broker",
            default=None,
            metavar="URL",
            help="AMQP broker URL (amqp://user:password@host:5672/vhost). Default: "
            "INBOX_BROKER_URL.",
        )
        parser.add_argument(
            "--batch-size", type=int, default=100, help="Rows claimed and published per batch."
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds,
            default=0.2,
            metavar="SECONDS",
            help="Sleep between polls when nothing is pending.",
        )
        add_stop_options(parser, "published messages")

    def handle(self, *args: Any, **options: Any) -> None:
        broker = options["broker"] or inbox_settings.broker_url
        if not broker:
            raise CommandError(
                "say which broker: --broker amqp://… or INBOX_BROKER_URL.", returncode=MISCONFIGURED
            )
        for name in ("batch_size", "max_messages"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(
                    f"--{name.replace('_', '-')} must be at least 1.", returncode=MISCONFIGURED
                )
        if not broker.startswith(("amqp://", "amqps://", "pyamqp://")):
            raise CommandError(
                f"outbox_relay publishes with AMQP publisher confirms; {broker.split(':')[0]}:// "
                "is not an AMQP URL.",
                returncode=MISCONFIGURED,
            )
        relay = Relay(
            broker,
            batch_size=options["batch_size"],
            poll_interval=options["poll_interval"],
            until_idle=options["until_idle"],
            max_messages=options["max_messages"],
            transport_options=inbox_settings.broker_transport_options,
        )
        with relay.shutdown.handling_signals():
            stats = relay.run()
        if options["verbosity"] >= 1:
            failed = sum(stats.failed.values())
            outcome = (
                f"; {failed} publication(s) failed ({stats.failed.get('pending', 0)} to be "
                f"retried, {stats.failed.get('dead', 0)} dead)"
                if failed
                else ""
            )
            self.stdout.write(
                f"outbox_relay: sent {stats.sent}"
                + outcome
                + (f", reconnected {stats.reconnects}x" if stats.reconnects else "")
            )
