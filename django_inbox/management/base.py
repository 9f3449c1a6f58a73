"""What the inbox's management commands share: exit codes, durations, times, stop options."""

from __future__ import annotations

from argparse import ArgumentTypeError
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser, SystemCheckError
from django.db import DatabaseError
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .. import clock
from ..conf import inbox_settings
from ..db.connection import describe, table_exists
from ..db.outage import misconfigured, refused_for_settings
from ..durations import to_seconds
from ..registry import registry
from ..wording import counted

#: Exit code of a command that is misconfigured (system check error, bad argument).
MISCONFIGURED = 2
#: Exit code of a command stopped by Ctrl-C (SIGINT) that has no stop of its own: the shell's.
INTERRUPTED = 130


def seconds(value: str) -> float:
    """argparse type: a duration such as ``30``, ``500ms``, ``5m``, ``30d``."""
    try:
        return to_seconds(value)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


#: The most rows one batch of a command takes (a transaction, a claim, a query's LIMIT).
BATCH_MAX = 100_000
#: AMQP's prefetch count and a TCP port are unsigned 16-bit numbers.
SHORT_MAX = 65_535


def count(low: int, high: int) -> Callable[[str], int]:
    """argparse type: an integer from ``low`` to ``high`` (a larger one failed deep inside a
    run: ``bigint out of range`` in a query's LIMIT, a ``struct.error`` in AMQP's prefetch)."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or not low <= number <= high:
            raise ArgumentTypeError(f"{value!r} is not an integer from {low:,} to {high:,}")
        return number

    return parse


def text(value: str) -> str:
    """argparse type: text a query can carry (an argument that is not UTF-8 arrives holding
    lone surrogates, and failed in the database driver with a traceback)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ArgumentTypeError(f"{value!r} is not UTF-8 text") from None
    if "\x00" in value:
        raise ArgumentTypeError(f"{value!r} holds a NUL character")
    return value


def moment(value: str) -> datetime:
    """argparse type: an ISO 8601 time (UTC unless it says otherwise), or a duration ago."""
    parsed = parse_datetime(value)
    if parsed is None:
        try:
            return clock.now() - timedelta(seconds=to_seconds(value))
        except ValueError:
            raise ArgumentTypeError(
                f"{value!r} is neither an ISO 8601 time (2026-11-21T03:00) nor a duration "
                "ago (90m, 2h)"
            ) from None
    if timezone.is_naive(parsed):
        parsed = timezone.make_aware(parsed, UTC)
    return parsed


def add_stop_options(parser: CommandParser, what: str) -> None:
    """``--max-messages`` and ``--until-idle``, shared by the long-running commands."""
    parser.add_argument(
        "--max-messages",
        type=count(1, 10**12),
        default=None,
        help=f"Exit after handling this many {what}.",
    )
    parser.add_argument(
        "--until-idle",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=f"Exit 0 once no {what[:-1]} came for this long (0: as soon as none is waiting).",
    )


class InboxCommand(BaseCommand):
    """Base of the inbox's commands: a system check error exits 2 (misconfigured), and so
    does a database without the inbox's table (``migrate`` was not run).

    ``waits_for_database``: a long-running command waits for an unreachable database (it may
    be starting, or restarting) instead of exiting; the others exit 2 at once.
    ``requires_migrated``: off for a command that says so in its own words (``inbox_stats``).
    """

    waits_for_database = False
    requires_migrated = True

    def check(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().check(*args, **kwargs)
        except SystemCheckError as exc:
            raise SystemCheckError(str(exc), returncode=MISCONFIGURED) from None

    def execute(self, *args: Any, **options: Any) -> Any:
        if self.requires_migrated:
            require_migrated(wait=self.waits_for_database)
        try:
            return super().execute(*args, **options)
        except KeyboardInterrupt:
            # Ctrl-C in a command without a stop of its own (purge, reclaim, replay): each
            # batch is its own transaction, so the ones done are kept and the rest untouched.
            raise CommandError(
                "interrupted: the batches done so far are committed, the rest is untouched; "
                "run the command again to go on",
                returncode=INTERRUPTED,
            ) from None


def require_migrated(*, wait: bool) -> None:
    """Exit 2 (``CommandError``) if the inbox's table does not exist: ``migrate`` was not run.

    An unreachable database exits 2 too, unless ``wait``: long-running commands wait for it
    in their loop, where a database that comes and goes is expected. One that refuses the
    connection for its settings (no such database or role, a wrong password) exits 2 always:
    it is not coming.
    """
    from ..models import InboxMessage

    using = inbox_settings.database
    table = InboxMessage._meta.db_table
    try:
        exists = table_exists(using, table)
    except DatabaseError as exc:
        if refused_for_settings(exc):
            raise CommandError(str(misconfigured(exc, using)), returncode=MISCONFIGURED) from None
        if wait:
            return
        raise CommandError(
            f"cannot reach the inbox's database {using!r} ({describe(exc)}); is it up, and "
            "do DATABASES point at it?",
            returncode=MISCONFIGURED,
        ) from None
    if not exists:
        raise CommandError(
            f"the inbox's table {table!r} does not exist in database {using!r}: run "
            "'manage.py migrate' first",
            returncode=MISCONFIGURED,
        )


def require_known_consumers(names: Iterable[str | None], *, with_handlers: bool = False) -> None:
    """Exit 2 (``CommandError``) with one line naming the known consumers if one of ``names``
    (the ``--consumer`` values given; ``None`` is none) is not known: a typo must not select
    nothing and pass for success.

    ``with_handlers``: the command runs handlers (``inbox_process``, ``inbox_consume``), so a
    consumer needs one, and the database is not asked (it may be away: those commands wait
    for it). Otherwise a consumer is known if it has handlers, a policy in
    ``INBOX_CONSUMERS``, or rows (listed by a loose index scan on PostgreSQL), as for
    ``inbox_stats --consumer``.
    """
    given = [name for name in dict.fromkeys(names) if name is not None]
    if with_handlers:
        known = registry.consumers(load=False)
        if any(name not in known for name in given):
            known = registry.consumers()  # an @inbox_task consumer: its module, then
        why = "no handler registered"
    else:
        cheap = set(registry.consumers(load=False)) | set(inbox_settings.consumers)
        if all(name in cheap for name in given):
            return  # no query needed
        from ..services import known_consumers

        known = known_consumers()
        why = "no handler, no policy in INBOX_CONSUMERS and no rows"
    unknown = [name for name in given if name not in known]
    if unknown:
        raise CommandError(
            f"unknown {counted(len(unknown), 'consumer', number=False)} "
            f"{', '.join(map(repr, unknown))}: {why}; known consumers: {known!r}",
            returncode=MISCONFIGURED,
        )


def add_commit_every_option(parser: CommandParser, help: str) -> None:
    """``--commit-every N``: messages per transaction (the consumer's ``commit_every``)."""
    parser.add_argument(
        "--commit-every", type=count(1, BATCH_MAX), default=None, metavar="N", help=help
    )


def add_metrics_option(parser: CommandParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=count(1, SHORT_MAX),
        default=None,
        metavar="PORT",
        help=(
            "Serve Prometheus metrics of this process (messages handled, processing time) on "
            "this port; needs the prometheus extra."
        ),
    )


def start_metrics(port: int | None) -> None:
    """Expose this process's counters on ``port`` (no database gauges: one scrape per worker
    must not query the database)."""
    if port is None:
        return
    try:
        from prometheus_client import start_http_server

        from ..contrib.prometheus import install
    except ImportError:
        raise CommandError(
            "--metrics-port needs prometheus-client: pip install "
            "'django-transactional-inbox[prometheus]'",
            returncode=MISCONFIGURED,
        ) from None
    install(gauges=False)
    start_http_server(port)
