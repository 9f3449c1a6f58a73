from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...services import DatabaseMisconfigured, Worker
from ..base import (
    BATCH_MAX,
    MISCONFIGURED,
    InboxCommand,
    add_commit_every_option,
    add_metrics_option,
    add_stop_options,
    count,
    require_known_consumers,
    seconds,
    start_metrics,
)


class Command(InboxCommand):
    help = (
        "Process stored inbox messages: new ones, failed ones due for retry, and ones whose "
        "worker died. Runs until stopped (SIGTERM/SIGINT: finish the current message, give "
        "back the rest of the batch, exit 0; a second signal rolls back and exits 1). "
        "Exit codes: 0 stopped normally, 1 interrupted, 2 misconfigured."
    )

    waits_for_database = True

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--consumer",
            action="append",
            dest="consumers",
            default=[],
            help="Consumer to process; repeat for several. Default: every consumer with handlers.",
        )
        parser.add_argument(
            "--batch-size",
            type=count(1, BATCH_MAX),
            default=None,
            help="Rows claimed per query (INBOX_BATCH_SIZE).",
        )
        add_stop_options(parser, "due messages")
        add_metrics_option(parser)
        add_commit_every_option(
            parser,
            (
                "Run N messages per transaction (default: each consumer's commit_every, "
                "INBOX_COMMIT_EVERY = 1). Faster; on a failure the batch is rolled back and "
                "rerun one message per transaction, so handlers may run twice."
            ),
        )
        parser.add_argument(
            "--poll-interval",
            type=seconds,
            default=None,
            metavar="SECONDS",
            help="Sleep between polls when nothing is due (INBOX_POLL_INTERVAL).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        consumers: list[str] = options["consumers"]
        require_known_consumers(consumers, with_handlers=True)
        for name in ("batch_size", "max_messages", "commit_every"):
            if options[name] is not None and options[name] < 1:
                raise CommandError(
                    f"--{name.replace('_', '-')} must be at least 1.", returncode=MISCONFIGURED
                )
        worker = Worker(
            consumers,
            batch_size=options["batch_size"],
            max_messages=options["max_messages"],
            until_idle=options["until_idle"],
            poll_interval=options["poll_interval"],
            commit_every=options["commit_every"],
        )
        start_metrics(options["metrics_port"])
        try:
            with worker.shutdown.handling_signals():
                stats = worker.run()
        except DatabaseMisconfigured as exc:
            raise CommandError(str(exc), returncode=MISCONFIGURED) from None
        if options["verbosity"] >= 1:
            counts = ", ".join(f"{k} {v}" for k, v in sorted(stats.outcomes.items())) or "nothing"
            self.stdout.write(f"inbox_process: handled {stats.handled} ({counts})")
