from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from ...conf import inbox_settings
from ...db.counting import EXACT_UP_TO
from ...services import PROBLEM_KINDS, STATUSES, FailureGroup, InboxStats, collect, failure_groups
from ..base import MISCONFIGURED, InboxCommand, require_known_consumers, seconds

#: Exit code when problems were found.
PROBLEMS = 1


class Command(InboxCommand):
    help = (
        "Count inbox rows per consumer and status and report problems: dead rows, stuck rows "
        "(in progress past their lease) and due rows waiting longer than "
        "INBOX_MAX_PENDING_AGE. Exit codes: 0 healthy, 1 problems found, 2 misconfigured "
        "(system check error, database or inbox table unreachable)."
    )

    requires_migrated = False  # it reports an unreadable table in its own words

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--consumer", default=None, help="Only this consumer.")
        parser.add_argument("--json", action="store_true", help="Print JSON (for scripts).")
        parser.add_argument(
            "--max-pending-age",
            type=seconds,
            default=None,
            metavar="DURATION",
            help="A due row waiting longer than this is a problem (INBOX_MAX_PENDING_AGE, 5m).",
        )
        parser.add_argument(
            "--ignore",
            action="append",
            choices=PROBLEM_KINDS,
            default=[],
            help="Don't count this kind of problem; repeatable.",
        )
        parser.add_argument(
            "--groups",
            action="store_true",
            help=(
                "List the failure groups instead: dead, parked and failed rows by exception "
                "and masked message, the largest first; inbox_replay --group ID replays one. "
                "Exit 0 (the groups are the report, not a health check)."
            ),
        )
        parser.add_argument(
            "--exact",
            action="store_true",
            help=(
                "Count every row, however many: a large table or backlog is otherwise "
                "estimated (completed rows above 100,000 rows in the table; other statuses "
                "above 10,000 rows of a family, then 1,000 of a consumer), which keeps this "
                "fast in an incident. A count takes what reading the rows takes: seconds on "
                "millions."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["groups"]:
            self._groups(options)
            return
        try:
            require_known_consumers([options["consumer"]])
            stats = collect(
                consumer=options["consumer"],
                max_pending_age=options["max_pending_age"],
                ignore=tuple(options["ignore"]),
                exact=options["exact"],
            )
        except DatabaseError as exc:
            raise CommandError(
                f"cannot read the inbox table ({exc.__class__.__name__}: "
                f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); is the "
                "database up and are migrations applied?",
                returncode=MISCONFIGURED,
            ) from None
        if options["json"]:
            self.stdout.write(json.dumps(stats.as_dict(), indent=2, default=str))
        elif options["verbosity"] >= 1:
            self.stdout.write(render(stats))
        if stats.problems:
            raise CommandError(f"{len(stats.problems)} problem(s) found", returncode=PROBLEMS)

    def _groups(self, options: dict[str, Any]) -> None:
        try:
            require_known_consumers([options["consumer"]])
            groups = failure_groups(consumer=options["consumer"])
        except DatabaseError as exc:
            raise CommandError(
                f"cannot read the inbox table ({exc.__class__.__name__}); is the database up "
                "and are migrations applied?",
                returncode=MISCONFIGURED,
            ) from None
        if options["json"]:
            self.stdout.write(
                json.dumps({"groups": [g.as_dict() for g in groups]}, indent=2, default=str)
            )
        elif options["verbosity"] >= 1:
            self.stdout.write(render_groups(groups))


def render_groups(groups: list[FailureGroup]) -> str:
    """The failure groups as ``inbox_stats --groups`` prints them."""
    if not groups:
        return "no dead, parked or failed rows"
    lines = []
    for group in groups:
        statuses = ", ".join(f"{status} {n:,}" for status, n in sorted(group.statuses.items()))
        lines.append(
            f"{group.id}  {group.count:,} row(s) ({statuses})  {group.consumer}  "
            f"{group.exception or '(no exception)'}"
        )
        lines.append(f"    {group.pattern or '(no message)'}")
        lines.append(
            f"    first {group.first_seen:%Y-%m-%d %H:%M:%S %Z}, last "
            f"{group.last_seen:%Y-%m-%d %H:%M:%S %Z}, e.g. {group.sample_message_id}"
        )
    total = sum(group.count for group in groups)
    lines.append(f"{len(groups):,} group(s), {total:,} row(s); replay one: inbox_replay --group ID")
    return "\n".join(lines)


def _count(n: int | None, estimated: bool = False) -> str:
    """A count as the table shows it: ``~`` alone when unknown, ``~1,234`` when estimated."""
    if n is None:
        return "~"
    return f"~{n:,}" if estimated else f"{n:,}"


def _age(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


#: Statuses only ordered consumers have: their columns are left out when no consumer shown is
#: ordered and no row has them.
ORDERED_STATUSES = ("waiting", "skipped")


def _shown_statuses(stats: InboxStats) -> list[str]:
    ordered = any(inbox_settings.ordered(name) for name in stats.consumers) or any(
        consumer.counts[status]
        for consumer in stats.consumers.values()
        for status in ORDERED_STATUSES
    )
    return [s for s in STATUSES if ordered or s not in ORDERED_STATUSES]


def render(stats: InboxStats) -> str:
    """The human table ``inbox_stats`` prints."""
    shown = _shown_statuses(stats)
    headers = ["consumer", *shown, "stuck", "oldest due"]
    table: list[list[str]] = []
    for name, consumer in sorted(stats.consumers.items()):
        counts = [_count(consumer.counts[s], s in consumer.estimated) for s in shown]
        table.append([name, *counts, f"{consumer.stuck:,}", _age(consumer.oldest_pending_age)])
    totals = stats.totals()
    estimated = {s for consumer in stats.consumers.values() for s in consumer.estimated}
    completed = ("~" if stats.completed_estimated else "") + f"{stats.completed_total:,}"
    table.append(
        [
            "(all)",
            *[completed if s == "completed" else _count(totals[s], s in estimated) for s in shown],
            f"{sum(c.stuck for c in stats.consumers.values()):,}",
            _age(max((c.oldest_pending_age for c in stats.consumers.values()), default=0)),
        ]
    )
    widths = [max(len(row[i]) for row in [headers, *table]) for i in range(len(headers))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in [headers, *table]
    ]
    if stats.completed_estimated:
        lines.append("~ completed rows estimated from the table size; --exact counts them")
    if estimated:
        lines.append(
            f"~ more than {EXACT_UP_TO:,} rows: the database's estimate, not a count of every "
            "row; --exact counts them"
        )
    for name, consumer in sorted(stats.consumers.items()):
        waiting = consumer.counts["waiting"] or 0
        if waiting or consumer.parked_gaps:
            lines.append(
                f"{name}: {waiting:,} waiting for an earlier sequence (oldest "
                f"{_age(consumer.oldest_waiting_age)}), {consumer.parked_gaps:,} parked for a gap"
            )
    if stats.outbox is not None:
        outbox = stats.outbox
        lines.append(
            f"outbox: {_count(outbox.pending, outbox.pending_estimated)} pending (oldest "
            f"{_age(outbox.oldest_pending_age)}), {_count(outbox.sent, outbox.sent_estimated)} "
            f"sent, {_count(outbox.dead, outbox.dead_estimated)} dead"
        )
    if stats.problems:
        lines.append("")
        lines.append(f"PROBLEMS ({len(stats.problems)}):")
        lines.extend(f"  - {problem.message}" for problem in stats.problems)
    else:
        lines.append("")
        lines.append("healthy")
    return "\n".join(lines)
