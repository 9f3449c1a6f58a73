from __future__ import annotations

import time
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ... import companions
from ...models import InboxMessage
from ...services import PURGEABLE, PurgeProgress, purge
from ...wording import counted
from ..base import BATCH_MAX, MISCONFIGURED, InboxCommand, count, require_known_consumers, seconds

#: Seconds between progress lines on a long run.
PROGRESS_EVERY = 5.0


def purgeable_status(value: str) -> str:
    if value in PURGEABLE:
        return value
    if value in InboxMessage.Status.values:
        raise ArgumentTypeError(
            f"{value} rows are never purged: they are still to be processed or wait for an "
            f"operator. Purgeable: {', '.join(PURGEABLE)}"
        )
    raise ArgumentTypeError(f"unknown status {value!r}; purgeable: {', '.join(PURGEABLE)}")


class Command(InboxCommand):
    help = (
        "Delete completed (and skipped) rows older than their retention (INBOX_RETENTION), "
        "and dead rows older than INBOX_DEAD_RETENTION if set, in short batches. Never deletes "
        "received, in_progress, failed, parked or waiting rows. A duplicate of a purged "
        "message is processed again. Exit codes: 0 done, 2 misconfigured."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--outbox",
            action="store_true",
            help=(
                "Purge the outbox (django_inbox.outbox) instead: delete sent rows older than "
                "INBOX_OUTBOX_RETENTION (or --older-than), in batches. Pending and dead rows "
                "are never deleted."
            ),
        )
        parser.add_argument(
            "--older-than",
            type=seconds,
            default=None,
            metavar="DURATION",
            help="Delete rows older than this (e.g. 30d) instead of each consumer's retention.",
        )
        parser.add_argument(
            "--status",
            type=purgeable_status,
            action="append",
            dest="statuses",
            default=[],
            help=(
                "completed, skipped or dead; repeat for several. Default: completed and "
                "skipped, and dead rows past INBOX_DEAD_RETENTION if one is set "
                "(--older-than applies to dead rows only when --status dead is given)."
            ),
        )
        parser.add_argument("--consumer", default=None, help="Only this consumer's rows.")
        parser.add_argument(
            "--batch-size",
            type=count(1, BATCH_MAX),
            default=1000,
            help="Rows deleted per transaction (1000). Smaller batches hold locks for less time.",
        )
        parser.add_argument(
            "--pause",
            type=seconds,
            default=0.0,
            metavar="DURATION",
            help="Sleep between batches, to go easy on a busy database (default 0).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1.", returncode=MISCONFIGURED)
        if options["outbox"]:
            self._purge_outbox(options)
            return
        require_known_consumers([options["consumer"]])
        statuses = tuple(dict.fromkeys(options["statuses"])) or None
        verbosity = options["verbosity"]
        last_report = time.monotonic()

        def report(progress: PurgeProgress) -> None:
            nonlocal last_report
            if verbosity >= 1 and time.monotonic() - last_report >= PROGRESS_EVERY:
                last_report = time.monotonic()
                self.stdout.write(
                    f"inbox_purge: {counted(progress.deleted, 'row')} deleted in "
                    f"{counted(progress.batches, 'batch')}, {progress.elapsed:.0f}s, "
                    f"{progress.rate:,.0f} rows/s"
                )

        result = purge(
            statuses=statuses,
            older_than=options["older_than"],
            consumer=options["consumer"],
            batch_size=options["batch_size"],
            dry_run=options["dry_run"],
            progress=report,
            pause=options["pause"],
        )
        if verbosity < 1:
            return
        for status in result.skipped:
            self.stdout.write(
                f"inbox_purge: {status} rows kept: no retention applies to them "
                "(set INBOX_DEAD_RETENTION, or give --status dead with --older-than)"
            )
        if result.held:
            self.stdout.write(
                f"inbox_purge: {counted(result.held, 'dead version')} of a re-run kept: each "
                "holds its key's rebuild (replay or skip it)"
            )
        counts = ", ".join(f"{n:,} {status}" for status, n in result.deleted.items()) or "nothing"
        if result.dry_run:
            self.stdout.write(f"inbox_purge: would delete {counts}")
        else:
            self.stdout.write(
                f"inbox_purge: deleted {counts} in {counted(result.batches, 'batch')}, "
                f"{result.elapsed:.1f}s ({result.rate:,.0f} rows/s)"
            )
        if result.tombstones_written or result.tombstones_expired:
            verb = "would keep" if result.dry_run else "kept"
            gone = "would delete" if result.dry_run else "deleted"
            self.stdout.write(
                f"inbox_purge: {verb} {counted(result.tombstones_written, 'tombstone')} of "
                f"completed rows (late copies of them are parked, not run), {gone} "
                f"{counted(result.tombstones_expired, 'expired tombstone')}"
            )

    def _purge_outbox(self, options: dict[str, Any]) -> None:
        outbox = companions.outbox()
        if outbox is None:
            raise CommandError(
                "--outbox: django_inbox.outbox is not in INSTALLED_APPS.", returncode=MISCONFIGURED
            )
        if options["statuses"] or options["consumer"] or options["dry_run"] or options["pause"]:
            raise CommandError(
                "--outbox deletes sent rows only; it takes --older-than and --batch-size.",
                returncode=MISCONFIGURED,
            )
        deleted = outbox.purge(older_than=options["older_than"], batch_size=options["batch_size"])
        if options["verbosity"] >= 1:
            self.stdout.write(f"inbox_purge --outbox: deleted {deleted:,} sent row(s)")
