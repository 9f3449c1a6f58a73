from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ....conf import inbox_settings
from ....management.base import (
    BATCH_MAX,
    MISCONFIGURED,
    InboxCommand,
    add_stop_options,
    count,
    seconds,
)
from ....management.broker_options import add_wait_for_broker_option, checked_broker_url
from ....services import DatabaseMisconfigured
from ....wording import counted
from ... import services
from ...progress import PROGRESS_EVERY, start_line


class Command(InboxCommand):
    help = (
        "Publish the outbox: claim pending rows (a key's oldest first, SKIP LOCKED so several "
        "relays share the work), publish them to the AMQP broker with publisher confirms "
        "(persistent, mandatory), and mark them sent once confirmed. Runs until stopped "
        "(SIGTERM/SIGINT: finish the batch, exit 0; a second signal exits 1). Exit codes: 0 "
        "stopped normally, 1 interrupted, 2 misconfigured (no broker, not AMQP, a broker never "
        "reached within --wait-for-broker, the outbox's table missing, a database refusing "
        "the connection for its settings)."
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
            "--batch-size",
            type=count(1, BATCH_MAX),
            default=100,
            help="Rows claimed and published per batch.",
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds,
            default=0.2,
            metavar="SECONDS",
            help="Sleep between polls when nothing is pending.",
        )
        add_wait_for_broker_option(parser)
        parser.add_argument(
            "--progress-every",
            type=seconds,
            default=PROGRESS_EVERY,
            metavar="DURATION",
            help=(
                "Print what was sent and failed since the last such line, at most this often "
                f"and only when something was (default {PROGRESS_EVERY:.0f}s); -v 0 prints "
                "nothing."
            ),
        )
        add_stop_options(parser, "published messages")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["broker"] is not None and not options["broker"].strip():
            raise CommandError("--broker is empty.", returncode=MISCONFIGURED)
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
        if options["progress_every"] <= 0:
            raise CommandError("--progress-every must be more than 0.", returncode=MISCONFIGURED)
        if not broker.startswith(("amqp://", "amqps://", "pyamqp://")):
            raise CommandError(
                f"outbox_relay publishes with AMQP publisher confirms; {broker.split(':')[0]}:// "
                "is not an AMQP URL.",
                returncode=MISCONFIGURED,
            )
        checked_broker_url(broker)
        if services.migrated() is False:
            raise CommandError(
                f"the outbox's table {services.TABLE!r} does not exist in database "
                f"{inbox_settings.database!r}: run 'manage.py migrate' first",
                returncode=MISCONFIGURED,
            )
        verbose = options["verbosity"] >= 1
        relay = services.relay(
            broker,
            batch_size=options["batch_size"],
            poll_interval=options["poll_interval"],
            until_idle=options["until_idle"],
            max_messages=options["max_messages"],
            wait_for_broker=options["wait_for_broker"] or None,
            progress=self.stderr.write if verbose else None,
            progress_every=options["progress_every"],
        )
        if verbose:
            self.stderr.write(start_line(relay))
        try:
            with relay.shutdown.handling_signals():
                stats = relay.run()
        except services.BrokerUnreachable as exc:
            raise CommandError(f"{exc}.", returncode=MISCONFIGURED) from None
        except DatabaseMisconfigured as exc:
            raise CommandError(str(exc), returncode=MISCONFIGURED) from None
        if verbose:
            self.stdout.write(summary(stats, relay.broker))


def summary(stats: services.RelayStats, broker: str) -> str:
    """The line printed when the relay stops (a broker never reached, and what waits for it,
    said too: ``--until-idle`` ends a relay that never reached it only when nothing was
    pending, a signal at any time)."""
    failed = sum(stats.failed.values())
    outcome = (
        f"; {counted(failed, 'publication')} failed ({stats.failed.get('pending', 0)} to be "
        "retried, "
        f"{stats.failed.get('dead', 0)} dead)"
        if failed
        else ""
    )
    return (
        f"outbox_relay: sent {stats.sent}"
        + outcome
        + (f", reconnected {stats.reconnects}x" if stats.reconnects else "")
        + (
            f"; the broker at {broker} was never reached, {services.pending_count()} pending"
            if not stats.reached
            else ""
        )
    )
