from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from ... import clock
from ...conf import inbox_settings
from ...services import ReclaimResult, reclaim
from ...wording import counted
from ..base import BATCH_MAX, MISCONFIGURED, InboxCommand, count, require_known_consumers, seconds


class Command(InboxCommand):
    help = (
        "Recover messages left in_progress by a worker that died or hangs (their lease "
        "expired): the running one becomes failed, its attempt counted (dead past its "
        "max_attempts); batch-mates that never started go back to due, uncounted. Never "
        "touches a row whose lease is still live. Exit codes: 0 done, 2 misconfigured (such "
        "as an unknown --consumer)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--consumer", default=None, help="Only this consumer's rows.")
        parser.add_argument(
            "--older-than",
            type=seconds,
            default=0.0,
            metavar="DURATION",
            help=(
                "Only rows claimed at least this long ago (e.g. 5m), in addition to their "
                "lease having expired. Default 0: every expired lease."
            ),
        )
        parser.add_argument(
            "--batch-size",
            type=count(1, BATCH_MAX),
            default=500,
            help="Rows per transaction (500).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would be reclaimed; change nothing."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1.", returncode=MISCONFIGURED)
        require_known_consumers([options["consumer"]])
        clock.synchronise(inbox_settings.database)  # leases expire on the database's clock
        result = reclaim(
            consumer=options["consumer"],
            older_than=options["older_than"],
            dry_run=options["dry_run"],
            batch_size=options["batch_size"],
        )
        verbosity = options["verbosity"]
        if verbosity >= 2:
            for consumer, message_id, status in result.rows:
                self.stdout.write(f"{consumer} {message_id} -> {status}")
        if verbosity >= 1:
            verb = "would reclaim" if options["dry_run"] else "reclaimed"
            self.stdout.write(
                f"inbox_reclaim: {verb} {result.total} row(s): {result.failed} failed "
                f"(retried after backoff), {result.dead} dead, {result.released} released "
                "unstarted" + _gaps(result)
            )


def _gaps(result: ReclaimResult) -> str:
    """What became of ordered consumers' waiting rows past their gap deadline."""
    said = ""
    if result.rearmed:
        said = (
            f"; gave a gap deadline to {counted(result.rearmed, 'waiting row')} whose "
            "predecessor was deleted"
        )
    if result.parked_gaps:
        return said + (
            f"; parked {counted(result.parked_gaps, 'waiting row')} whose gap outlived gap_timeout"
        )
    if result.expired_gaps:
        return (
            f"; would look at {counted(result.expired_gaps, 'waiting row')} past gap_timeout "
            "(parked if its gap is still open)"
        )
    return said
