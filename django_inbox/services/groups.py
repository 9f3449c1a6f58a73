"""Failure groups: the ``dead``, ``parked`` and ``failed`` rows of a consumer grouped by their
cause, the exception class and its message with what varies from one row to the next masked
(quoted values, addresses, ids, times, numbers). Dead letters from three causes mixed together
become three groups, each replayed or parked as one.

The cause is read from ``last_error`` (``"Type: message"``, as every failure writes it), and
the rows are grouped here rather than in SQL, so that every database groups them alike: the
work is one read of the problem rows (their statuses' partial indexes find them) and a few
regular expressions per row, about 0.1 s for 10,000 rows.
"""

from __future__ import annotations

import hashlib
import heapq
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from ..conf import inbox_settings
from ..models import ATTENTION_STATUSES, InboxMessage

Status = InboxMessage.Status

#: The statuses whose rows are grouped.
GROUPED: tuple[str, ...] = (Status.DEAD, Status.PARKED, Status.FAILED)
#: The longest pattern kept (the rest of a long message rarely tells causes apart).
PATTERN_MAX = 300

_EXCEPTION = re.compile(r"([A-Za-z_][\w.]*)(?:: (.*))?", re.DOTALL)
#: What varies between rows of one cause, each masked by its name: one pass of one
#: expression, its alternatives tried in this order at each position (an address before the
#: numbers in it, a time before its digits).
_VARYING = re.compile(
    "|".join(
        f"(?P<{name}>{expression})"
        for name, expression in (
            ("str", r"'[^'\n]*'|\"[^\"\n]*\"|`[^`\n]*`"),
            ("url", r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+"),
            ("email", r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*"),
            ("uuid", r"\b[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}\b"),
            (
                "time",
                r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?"
                r"(?:Z|[+-]\d{2}:?\d{2})?",
            ),
            (
                "ip",
                r"\[[0-9a-fA-F:]*:[0-9a-fA-F:]*\](?::\d+)?|\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b",
            ),
            # A word with both letters and digits: an id (evt_1Nx9, ORD-7, ORD-2231, 0x7f3a),
            # whatever its length, so that ids of every length fall in one group.
            ("id", r"\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]+\b"),
            ("num", r"\d+(?:\.\d+)?"),
        )
    )
)
_SPACES = re.compile(r"\s+")


def _mask(match: re.Match[str]) -> str:
    return f"<{match.lastgroup}>"


def cause(last_error: str) -> tuple[str, str]:
    """The exception class and the masked message of a row's ``last_error``."""
    match = _EXCEPTION.fullmatch(last_error.strip())
    exception, message = (match.group(1), match.group(2) or "") if match else ("", last_error)
    message = _SPACES.sub(" ", _VARYING.sub(_mask, message))
    return exception, message.strip()[:PATTERN_MAX]


def group_id(consumer: str, exception: str, pattern: str) -> str:
    """A group's id: the same for the same cause, whenever and wherever it is computed."""
    digest = hashlib.sha256(f"{consumer}\0{exception}\0{pattern}".encode()).hexdigest()
    return digest[:12]


@dataclass
class FailureGroup:
    """The rows of one consumer failing for one cause."""

    id: str
    consumer: str
    exception: str
    pattern: str
    count: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    sample_message_id: str = ""
    sample_error: str = ""
    sample_pk: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _rows(
    consumer: str | None, statuses: Iterable[str]
) -> Iterator[tuple[int, str, str, str, str, datetime]]:
    """The rows of ``statuses`` in primary-key order. Dead and parked rows are read apart from
    failed ones: each set has its partial index, and one ``IN`` list over both would have
    neither (a scan of the table)."""
    wanted = set(statuses)
    reads = []
    for family in (ATTENTION_STATUSES, (Status.FAILED,)):
        chosen = [status for status in family if status in wanted]
        wanted -= set(chosen)
        if chosen:
            reads.append(chosen)
    if wanted:
        reads.append(sorted(wanted))
    queries = []
    for chosen in reads:
        rows = InboxMessage.objects.using(inbox_settings.database).filter(status__in=chosen)
        if consumer:
            rows = rows.filter(consumer=consumer)
        queries.append(
            rows.order_by("pk")
            .values_list("pk", "consumer", "message_id", "status", "last_error", "updated_at")
            .iterator(chunk_size=5000)
        )
    yield from heapq.merge(*queries, key=lambda row: row[0])


def failure_groups(
    *, consumer: str | None = None, statuses: Iterable[str] = GROUPED
) -> list[FailureGroup]:
    """The groups of the rows in ``statuses`` (of ``consumer``, if given), the largest first.
    A group's sample is its most recent row."""
    groups: dict[str, FailureGroup] = {}
    for pk, name, message_id, status, last_error, updated_at in _rows(consumer, statuses):
        exception, pattern = cause(last_error)
        key = group_id(name, exception, pattern)
        group = groups.get(key)
        if group is None:
            group = groups[key] = FailureGroup(key, name, exception, pattern)
        group.count += 1
        group.statuses[status] = group.statuses.get(status, 0) + 1
        if group.first_seen is None or updated_at < group.first_seen:
            group.first_seen = updated_at
        if group.last_seen is None or updated_at >= group.last_seen:
            group.last_seen = updated_at
            group.sample_message_id, group.sample_error, group.sample_pk = (
                message_id,
                last_error,
                pk,
            )
    return sorted(
        groups.values(),
        key=lambda g: (-g.count, -(g.last_seen.timestamp() if g.last_seen else 0.0), g.id),
    )


def group_pks(
    group: str,
    *,
    statuses: Iterable[str] = GROUPED,
    consumer: str | None = None,
    limit: int | None = None,
) -> list[int]:
    """The ids of the rows in ``statuses`` that belong to ``group``, in order: all of them, or
    the first ``limit``. ``consumer`` (the group's own) narrows the rows read."""
    found: list[int] = []
    for pk, name, _message_id, _status, last_error, _at in _rows(consumer, statuses):
        if group_id(name, *cause(last_error)) == group:
            found.append(pk)
    found.sort()
    return found if limit is None else found[:limit]


class UnknownGroup(ValueError):
    """Failure group ids that hold no dead, parked or failed row (mistyped, or from before the
    rows changed: an id changes with the consumer, the exception or the masked message)."""


def rows_of_groups(groups: Iterable[str], *, statuses: Iterable[str]) -> list[int]:
    """The ids of the rows in ``statuses`` of any of ``groups``, in order (one read of the
    grouped rows). Raises :class:`UnknownGroup` for a group with no grouped row at all."""
    wanted, chosen = set(groups), set(statuses)
    seen: set[str] = set()
    found: list[int] = []
    for pk, name, _message_id, status, last_error, _at in _rows(None, GROUPED):
        key = group_id(name, *cause(last_error))
        if key in wanted:
            seen.add(key)
            if status in chosen:
                found.append(pk)
    if wanted - seen:
        raise UnknownGroup(", ".join(repr(group) for group in sorted(wanted - seen)))
    return sorted(found)
