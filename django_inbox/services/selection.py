"""Finding rows for an operator: by criteria (``inbox_replay``), by id (``inbox_show``), counted
by status (the confirmations), and who is acting (``user@host (command)``)."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Iterable
from datetime import datetime

from django.db import connections
from django.db.models import Count, QuerySet

from ..conf import inbox_settings
from ..db import counting
from ..db.aside import with_status
from ..db.counting import estimate, sample
from ..db.identity import identified
from ..models import InboxMessage
from .stats import known_consumers


def command_actor(command: str) -> str:
    """Who runs a management command, for the history: ``user@host (command)``."""
    try:
        user = getpass.getuser()
    except Exception:  # no login name (some containers)
        user = "unknown"
    return f"{user}@{socket.gethostname()} ({command})"


def select(
    *,
    pks: list[int] | None = None,
    message_ids: list[str] | None = None,
    consumer: str | None = None,
    event_types: list[str] | None = None,
    statuses: list[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    keys: list[str] | None = None,
) -> QuerySet[InboxMessage]:
    """Rows matching every criterion given. ``since``/``until`` apply to ``updated_at``:
    when the row reached its current status (went dead, was parked, completed).

    A list criterion left at ``None`` matches any value; an empty list matches no row (so
    replaying "the selected ids" when none were selected changes nothing, not everything).

    Rows picked by id are found by their index whatever else is given: message ids are
    looked up at once, in every consumer by name (the unique index is ``(consumer,
    message_id)``), and the selection continues with their primary keys (the batches of an
    action walk them in order, ``id > last``: by message id they walked the table); their
    status is tested aside (``with_status``) so that no status's partial index is read whole.
    """
    using = inbox_settings.database
    rows: QuerySet[InboxMessage] = InboxMessage.objects.using(using).all()
    if pks is not None:
        rows = rows.filter(pk__in=pks)
    if message_ids is not None:
        named = by_message_id(InboxMessage.objects.using(using), message_ids, consumer)
        rows = rows.filter(pk__in=list(named.values_list("pk", flat=True)))
    if consumer:
        rows = rows.filter(consumer=consumer)
    if event_types is not None:
        rows = rows.filter(event_type__in=event_types)
    if statuses is not None:
        by_id = pks is not None or message_ids is not None
        rows = with_status(rows, *statuses) if by_id else rows.filter(status__in=statuses)
    if keys is not None:
        rows = rows.filter(key__in=keys)
    if since is not None:
        rows = rows.filter(updated_at__gte=since)
    if until is not None:
        rows = rows.filter(updated_at__lt=until)
    return rows


def find(
    *,
    message_ids: list[str] | None = None,
    pks: list[int] | None = None,
    consumer: str | None = None,
) -> list[InboxMessage]:
    """Rows with any of ``message_ids`` or ``pks`` (in ``consumer``, if given), by consumer
    and id: what ``inbox_show`` prints."""
    base = InboxMessage.objects.using(inbox_settings.database).for_consumer(consumer)
    rows = base.none()
    if message_ids:
        rows = rows | by_message_id(base, message_ids, consumer)
    if pks:
        rows = rows | base.filter(pk__in=pks)
    return list(rows.order_by("consumer", "pk"))


def by_message_id(
    rows: QuerySet[InboxMessage], message_ids: list[str], consumer: str | None
) -> QuerySet[InboxMessage]:
    """``rows`` with one of ``message_ids`` (in ``consumer``, if given). On PostgreSQL, MariaDB
    and MySQL, without a consumer, in every consumer by name (listed by a loose index scan),
    so that the unique index of identities finds them; on SQLite listing them would read the
    table."""
    if consumer:
        return identified(rows, *((consumer, message_id) for message_id in message_ids))
    if connections[rows.db].vendor not in ("postgresql", "mysql"):
        return rows.filter(message_id__in=message_ids)
    consumers = known_consumers()
    return identified(
        rows, *((name, message_id) for name in consumers for message_id in message_ids)
    )


def count_by_status(rows: QuerySet[InboxMessage]) -> dict[str, int]:
    """How many of ``rows`` are in each status (one ``GROUP BY``)."""
    return {
        row["status"]: row["n"] for row in rows.order_by().values("status").annotate(n=Count("pk"))
    }


def tally_by_status(
    rows: QuerySet[InboxMessage],
    *,
    limit: int | None = None,
    also: Iterable[str] = (),
) -> tuple[dict[str, int], bool]:
    """``count_by_status`` that reads at most ``limit`` + 1 rows: ``(counts, estimated)``.
    Over the limit, each status met, and each of ``also`` (the statuses an action changes,
    which the rows read may have missed), is the planner's estimate (never less than was
    read): what a confirmation of "select all" shows without counting half a million rows."""
    found = sample(rows, ("status",), limit=counting.EXACT_UP_TO if limit is None else limit)
    counts = {group["status"]: int(group["n"]) for group in found.groups}
    if found.complete:
        return counts, False
    for status in dict.fromkeys([*counts, *also]):
        guess = estimate(rows.filter(status=status))
        if guess is None:  # no planner estimate (SQLite): count
            return count_by_status(rows), False
        counts[status] = max(guess, counts.get(status, 0))
    return counts, True


def consumers_of(rows: QuerySet[InboxMessage], *, limit: int | None = None) -> list[str]:
    """The consumers ``rows`` belong to, from at most ``limit`` + 1 rows; over that, every
    consumer known (a selection that large may hold any of them)."""
    found = sample(rows, ("consumer",), limit=counting.EXACT_UP_TO if limit is None else limit)
    if found.complete:
        return sorted(group["consumer"] for group in found.groups)
    return known_consumers()
