"""Counts that stay fast on tables of millions of rows: exact up to a limit, estimated beyond.

An operator's surfaces (the health view, ``inbox_stats``, the metrics, the admin) must answer
in an incident, when a backlog of hundreds of thousands of rows is exactly what they are asked
about. Counting such a backlog row by row takes what reading it takes. So each count here reads
at most :data:`EXACT_UP_TO` + 1 rows: if fewer match, the count is exact; if more, it is the
database planner's estimate of the same query (never less than what was read), and marked as
an estimate. ``exact=True`` counts everything, as slowly as that is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.models import DateTimeField, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

#: Counts up to this many rows are exact; above it they are estimated.
EXACT_UP_TO = 10_000
#: When a family of statuses has more rows than :data:`EXACT_UP_TO`, each consumer is counted
#: on its own, exactly up to this many rows (a page of index entries per consumer, not ten).
EXACT_PER_CONSUMER = 1_000


@dataclass(frozen=True)
class Sample:
    """The groups of a bounded read: one dict per group (its columns, ``n`` and the
    aggregates), and whether every matching row was read (then the numbers are exact)."""

    groups: list[dict[str, Any]]
    complete: bool

    @property
    def total(self) -> int:
        return sum(int(group["n"]) for group in self.groups)


def sample(
    queryset: QuerySet[Any],
    group_by: Sequence[str],
    aggregates: dict[str, tuple[str, str]] | None = None,
    *,
    limit: int | None = EXACT_UP_TO,
    order_by: Sequence[str] = (),
    columns: Sequence[str] = (),
    params: Sequence[Any] = (),
) -> Sample:
    """Group at most ``limit`` + 1 rows of ``queryset`` (read in ``order_by``, which should
    be an index's order) by ``group_by``; ``limit=None`` reads them all.

    ``aggregates`` maps an output name to ``(function, column)``: ``("min", "received_at")``
    or ``("sum_if", "<condition on the inner columns>")``; ``params`` fill the conditions'
    ``%s``, and ``columns`` name what they read besides the grouped and aggregated
    columns (the rows' columns keep their names: ``s."next_attempt_at"``).
    """
    aggregates = aggregates or {}
    using = queryset.db
    connection = connections[using]
    quote = connection.ops.quote_name
    selected_columns = list(dict.fromkeys([*group_by, *_columns(aggregates), *columns]))
    inner = queryset.order_by(*order_by).values_list(*selected_columns)
    if limit is not None:
        inner = inner[: limit + 1]
    inner_sql, inner_params = _compiled(inner)
    names = [quote(name) for name in group_by]
    selected = [f"s.{name}" for name in names] + ["COUNT(*)"]
    for function, argument in aggregates.values():
        if function == "sum_if":
            selected.append(f"SUM(CASE WHEN {argument} THEN 1 ELSE 0 END)")
        else:
            selected.append(f"{function.upper()}(s.{quote(argument)})")
    outer_sql = f"SELECT {', '.join(selected)} FROM ({inner_sql}) s"
    if names:
        outer_sql += f" GROUP BY {', '.join(f's.{name}' for name in names)}"
    with connection.cursor() as cursor:
        cursor.execute(outer_sql, [*params, *inner_params])  # the select list comes first
        rows = cursor.fetchall()
    keys = [*group_by, "n", *aggregates]
    groups = [dict(zip(keys, row, strict=True)) for row in rows if row[len(group_by)]]
    for group in groups:
        for name, (function, argument) in aggregates.items():
            if function == "sum_if":
                group[name] = int(group[name] or 0)
            elif _is_datetime(queryset, argument):
                group[name] = _as_datetime(group[name])
    total = sum(int(group["n"]) for group in groups)
    return Sample(groups, complete=limit is None or total <= limit)


def _compiled(queryset: QuerySet[Any]) -> tuple[str, tuple[Any, ...]]:
    """The SQL of ``queryset`` for its own database (``INBOX_DATABASE`` may not be
    ``default``, nor of its kind)."""
    sql, params = queryset.query.get_compiler(using=queryset.db).as_sql()
    return sql, tuple(params)


def _columns(aggregates: dict[str, tuple[str, str]]) -> Iterable[str]:
    for function, argument in aggregates.values():
        if function != "sum_if":
            yield argument


def _is_datetime(queryset: QuerySet[Any], name: str) -> bool:
    return isinstance(queryset.model._meta.get_field(name), DateTimeField)


def _as_datetime(value: Any) -> Any:
    """A ``MIN``/``MAX`` of a datetime column read through raw SQL: a string on SQLite and a
    naive UTC datetime on MariaDB and MySQL, made an aware datetime as the ORM would."""
    if isinstance(value, str):
        value = parse_datetime(value)
    if isinstance(value, datetime) and settings.USE_TZ and timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value


def bounded_count(
    queryset: QuerySet[Any], *, limit: int | None = EXACT_UP_TO, guess: bool = True
) -> tuple[int, bool]:
    """``(count, estimated)``: exact when at most ``limit`` rows match (read through a
    ``LIMIT``), else the planner's estimate, never less than ``limit`` + 1 (``guess=False``:
    ``limit`` + 1 itself, a lower bound, and no estimate is asked for)."""
    if limit is None:
        return queryset.order_by().count(), False
    found = queryset.order_by()[: limit + 1].count()
    if found <= limit or not guess:
        return found, found > limit
    planned = estimate(queryset)
    if planned is None:  # no planner estimate (SQLite): count
        return queryset.order_by().count(), False
    return max(planned, found), True


def estimate(queryset: QuerySet[Any]) -> int | None:
    """The database planner's estimate of the rows ``queryset`` matches, without reading
    them (PostgreSQL's ``EXPLAIN``; MariaDB's and MySQL's rows times filtered); ``None``
    where there is none (SQLite). It comes from the table's statistics (``ANALYZE``): after
    a sudden change it can be far off until they are refreshed."""
    sql, params = _compiled(queryset.order_by().values("pk"))
    return _explain(queryset.db, sql, params)


def _explain(using: str, sql: str, params: Sequence[Any]) -> int | None:
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0]
        if isinstance(plan, str):
            plan = json.loads(plan)
        return int(plan[0]["Plan"]["Plan Rows"])
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN {sql}", params)
            names = [column[0] for column in cursor.description]
            row = dict(zip(names, cursor.fetchone(), strict=True))
        rows = float(row.get("rows") or 0)
        filtered = float(row.get("filtered") or 100)
        return int(rows * filtered / 100)
    return None


#: Statements per ``UNION ALL`` (SQLite takes at most 500 in one compound ``SELECT``).
UNION_TERMS = 100
#: Stands for a consumer's name while a per-consumer statement is compiled once.
_NAME = "\x00consumer\x00"


def _per_consumer(
    queryset: QuerySet[Any], names: Sequence[str], shape: Callable[[QuerySet[Any]], Any]
) -> list[tuple[str, list[Any]]]:
    """``shape(queryset.filter(consumer=name))`` for each of ``names``, compiled once: the SQL
    and each name's parameters (compiling a queryset costs more than running these
    statements)."""
    sql, compiled = _compiled(shape(queryset.filter(consumer=_NAME)))
    params = list(compiled)
    where = [i for i, value in enumerate(params) if value == _NAME]
    if len(where) != 1:
        raise ValueError("the consumer must appear once in the statement")
    found = []
    for name in names:
        mine = list(params)
        mine[where[0]] = name
        found.append((sql, mine))
    return found


def _union(
    using: str, statements: list[tuple[str, list[Any]]], select: str
) -> list[tuple[Any, ...]]:
    """Run ``SELECT i, <select> FROM (<statement i>) s<i>`` for every statement in one round
    trip (``UNION ALL``); ``{alias}`` in ``select`` names the statement's alias."""
    found: list[tuple[Any, ...]] = []
    for start in range(0, len(statements), UNION_TERMS):
        parts: list[str] = []
        params: list[Any] = []
        for index, (sql, mine) in enumerate(statements[start : start + UNION_TERMS], start):
            alias = f"s{index}"
            parts.append(f"SELECT {index}, {select.format(alias=alias)} FROM ({sql}) {alias}")
            params.extend(mine)
        with connections[using].cursor() as cursor:
            cursor.execute(" UNION ALL ".join(parts), params)
            found.extend(cursor.fetchall())
    return found


def bounded_counts(
    queryset: QuerySet[Any], names: Sequence[str], *, limit: int = EXACT_UP_TO
) -> dict[str, int]:
    """:func:`bounded_count` of ``queryset`` for each consumer of ``names``, in one round
    trip (``UNION ALL``): each reads at most ``limit`` + 1 rows (``limit`` + 1: "more")."""
    if not names:
        return {}
    statements = _per_consumer(queryset, names, lambda q: q.order_by().values("pk")[: limit + 1])
    found = dict(_union(queryset.db, statements, "COUNT(*)"))
    return {name: int(found.get(i, 0)) for i, name in enumerate(names)}


def firsts(
    queryset: QuerySet[Any], names: Sequence[str], fields: Sequence[str], order_by: Sequence[str]
) -> dict[str, tuple[Any, ...]]:
    """The first row (its ``fields``, in ``order_by``) of ``queryset`` for each consumer of
    ``names``, in one round trip; consumers without rows are left out."""
    if not names:
        return {}
    statements = _per_consumer(
        queryset, names, lambda q: q.order_by(*order_by).values_list(*fields)[:1]
    )
    rows = _union(queryset.db, statements, "{alias}.*")
    convert = [_is_datetime(queryset, name) for name in fields]
    return {
        names[row[0]]: tuple(
            _as_datetime(value) if datetime_field else value
            for value, datetime_field in zip(row[1:], convert, strict=True)
        )
        for row in rows
    }


def estimates(queryset: QuerySet[Any], names: Sequence[str]) -> dict[str, int | None]:
    """:func:`estimate` of ``queryset`` for each consumer of ``names`` (one ``EXPLAIN``
    each, compiled once)."""
    return {
        name: _explain(queryset.db, sql, params)
        for name, (sql, params) in zip(
            names, _per_consumer(queryset, names, lambda q: q.order_by().values("pk")), strict=True
        )
    }
