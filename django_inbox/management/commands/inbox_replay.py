from __future__ import annotations

from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ... import clock
from ...conf import inbox_settings
from ...models import InboxMessage
from ...services import (
    REPLAYABLE,
    command_actor,
    count_by_status,
    replay,
    select,
)
from ...services.groups import UnknownGroup, rows_of_groups
from ..base import (
    INTERRUPTED,
    MISCONFIGURED,
    InboxCommand,
    moment,
    require_known_consumers,
    text,
)
from ..following import follow_rerun
from ..prompt import ask, at_a_terminal

SELECTABLE = (*REPLAYABLE, InboxMessage.Status.COMPLETED)


def replayable_status(value: str) -> str:
    if value in SELECTABLE:
        return value
    raise ArgumentTypeError(
        f"{value!r} cannot be replayed; choose from {', '.join(SELECTABLE)} (failed rows are "
        "retried on their own; received and in_progress ones are being processed)"
    )


class Command(InboxCommand):
    help = (
        "Send dead and parked messages (and, with --force, completed ones) back to received: "
        "the same row and message id, a fresh set of attempts, history kept and the replay "
        "recorded in it. Select by id, message id, consumer, event type, status and time, or "
        "--all for every dead and parked row; the count is shown before anything changes "
        "(and confirmed at a terminal). Exit codes: 0 done (or nothing matched, or "
        "cancelled), 1 some selected rows were refused (with --wait: some re-run rows ended "
        "dead or parked), 2 misconfigured (no selection, an unknown --consumer), 130 --wait "
        "stopped by Ctrl-C."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--id", type=int, action="append", dest="pks", default=[], help="Row id; repeatable."
        )
        parser.add_argument(
            "--message-id",
            type=text,
            action="append",
            dest="message_ids",
            default=[],
            help="Message id; repeatable.",
        )
        parser.add_argument("--consumer", default=None, help="Only this consumer's rows.")
        parser.add_argument(
            "--group",
            action="append",
            dest="groups",
            default=[],
            metavar="ID",
            help="A failure group's rows (inbox_stats --groups lists them); repeatable.",
        )
        parser.add_argument(
            "--key",
            type=text,
            action="append",
            dest="keys",
            default=[],
            help="Ordering key; repeatable (with --force, a key's rebuild).",
        )
        parser.add_argument(
            "--event-type",
            type=text,
            action="append",
            dest="event_types",
            default=[],
            help="Event type; repeatable.",
        )
        parser.add_argument(
            "--status",
            type=replayable_status,
            action="append",
            dest="statuses",
            default=[],
            help="dead, parked or completed; repeatable. Default: dead and parked.",
        )
        parser.add_argument(
            "--since",
            type=moment,
            default=None,
            metavar="TIME",
            help=(
                "Only rows that reached their status (went dead, were parked, completed) at or "
                "after TIME: ISO 8601 (UTC unless it says otherwise) or a duration ago (2h)."
            ),
        )
        parser.add_argument(
            "--until", type=moment, default=None, metavar="TIME", help="… and before TIME."
        )
        parser.add_argument(
            "--force",
            action="store_true",
            help=(
                "Also re-run completed rows: their handlers run again, as re-runs "
                "(message.is_rerun); @side_effect calls run or are suppressed as each "
                "consumer's side_effects_on_rerun says. An ordered consumer's keys re-run in "
                "sequence order from their first selected version. Needs --reason."
            ),
        )
        parser.add_argument(
            "--wait",
            action="store_true",
            help=(
                "After a re-run (--force), follow the workers until every re-run row of the "
                "selected consumers has run, printing progress; exit 1 if some end dead or "
                "parked."
            ),
        )
        parser.add_argument("--reason", default="", help="Why; recorded in each row's history.")
        parser.add_argument(
            "--dry-run", action="store_true", help="Print what would be replayed; change nothing."
        )
        parser.add_argument(
            "--all",
            action="store_true",
            help="Select every dead and parked row (needed when no other selection is given).",
        )
        parser.add_argument(
            "--no-input",
            action="store_false",
            dest="interactive",
            help="Do not ask for confirmation at a terminal.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.started_at = clock.now()
        if options["force"] and not options["reason"].strip():
            raise CommandError(
                "--force re-runs completed messages; say why with --reason.",
                returncode=MISCONFIGURED,
            )
        if options["wait"] and not options["force"]:
            raise CommandError(
                "--wait follows a re-run: it goes with --force.", returncode=MISCONFIGURED
            )
        if options["since"] and options["until"] and options["since"] >= options["until"]:
            raise CommandError(
                "--since is not before --until: the window holds no row.", returncode=MISCONFIGURED
            )
        criteria = (
            "groups",
            "pks",
            "message_ids",
            "consumer",
            "event_types",
            "statuses",
            "since",
            "until",
            "keys",
        )
        if not options["all"] and not any(options[name] for name in criteria):
            raise CommandError(
                "say what to replay: --group, --status, --consumer, --event-type, --key, --id, "
                "--message-id, --since/--until, or --all for every dead and parked row.",
                returncode=MISCONFIGURED,
            )
        require_known_consumers([options["consumer"]])
        statuses = options["statuses"] or list(REPLAYABLE)
        pks = options["pks"] or None
        if options["groups"]:
            try:
                in_groups = rows_of_groups(options["groups"], statuses=statuses)
            except UnknownGroup as exc:
                raise CommandError(
                    f"no failure group {exc}: inbox_stats --groups lists them (an id changes "
                    "with the consumer, the exception or the masked message)",
                    returncode=MISCONFIGURED,
                ) from None
            pks = in_groups if pks is None else sorted(set(in_groups) & set(pks))
        rows = select(
            pks=pks,
            message_ids=options["message_ids"] or None,
            consumer=options["consumer"],
            event_types=options["event_types"] or None,
            statuses=statuses,
            since=options["since"],
            until=options["until"],
            keys=options["keys"] or None,
        )
        verbosity = options["verbosity"]
        if not options["dry_run"] and not self._confirmed(rows, options, verbosity):
            self.stdout.write("inbox_replay: cancelled; nothing replayed")
            return
        consumers = (
            sorted(set(rows.order_by().values_list("consumer", flat=True).distinct()))
            if options["force"]
            else []
        )
        following = options["wait"] and options["force"] and not options["dry_run"]
        result = replay(
            rows,
            actor=command_actor("inbox_replay"),
            reason=options["reason"].strip(),
            force=options["force"],
            dry_run=options["dry_run"],
            via="command",
            # Following a re-run counts its own rows: all of them are kept.
            keep=None if following else 100,
        )
        if verbosity >= 2 or (options["dry_run"] and verbosity >= 1):
            for pk, consumer, message_id, status in result.rows:
                self.stdout.write(f"{pk} {consumer} {message_id} ({status})")
            if result.total > len(result.rows):
                self.stdout.write(f"… and {result.total - len(result.rows):,} more")
        if verbosity >= 1:
            verb = "would replay" if options["dry_run"] else "replayed"
            counts = ", ".join(f"{s} {n:,}" for s, n in sorted(result.changed.items()))
            self.stdout.write(
                f"inbox_replay: {verb} {result.total:,} row(s)" + (f" ({counts})" if counts else "")
            )
        if verbosity >= 1:
            for said in result.notes:
                self.stdout.write(f"  {said}")
            if result.more_notes:
                self.stdout.write(f"  … and {result.more_notes:,} more key(s) with notes")
            if options["force"] and result.changed.get("completed"):
                self._side_effects(consumers, options["dry_run"])
        if result.refused:
            refused = "; ".join(f"{n:,} {why}" for why, n in sorted(result.refused.items()))
            raise CommandError(f"refused {refused}", returncode=1)
        if following:
            reruns = [pk for pk, _, _, was in result.rows if was in ("completed", "skipped")]
            try:
                follow_rerun(self.stdout, consumers, reruns, verbosity, since=self.started_at)
            except KeyboardInterrupt:  # Ctrl-C: the re-run is the workers', not this process's
                raise CommandError(
                    "stopped following (interrupted); the re-run goes on in the workers: "
                    "follow it with inbox_stats or the admin",
                    returncode=INTERRUPTED,
                ) from None

    def _side_effects(self, consumers: list[str], dry_run: bool) -> None:
        """Say, per consumer re-run, whether its @side_effect calls run or are suppressed."""
        from ... import side_effects

        known = ", ".join(sorted(side_effects.known)) or "none imported by this process"
        for consumer in consumers:
            if inbox_settings.policy(consumer).suppresses_side_effects:
                what = f"suppressed (@side_effect functions: {known})"
            else:
                what = "run again (side_effects_on_rerun='run')"
            verb = "would be" if dry_run else "are"
            self.stdout.write(f"  {consumer}: side effects of re-runs {verb} {what}")

    def _confirmed(self, rows: Any, options: dict[str, Any], verbosity: int) -> bool:
        """Say how many rows are selected, by status; at a terminal, ask before going on."""
        counts = count_by_status(rows)
        total = sum(counts.values())
        if verbosity >= 1:
            by_status = ", ".join(f"{s} {n:,}" for s, n in sorted(counts.items()))
            self.stdout.write(f"Selected {total:,} row(s)" + (f" ({by_status})" if total else ""))
        if not total or not options["interactive"] or not at_a_terminal():
            return True
        answer = ask("Replay them? [y/N] ")
        if answer is None:  # Ctrl-D: no answer is no
            self.stdout.write("")
            return False
        return answer.strip().lower() in ("y", "yes")
