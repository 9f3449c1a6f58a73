"""Status tests that no partial index answers, for the ORM's lookups of rows found by another
index: a primary key, a message id, a key's versions.

Each status the workers or operators look for has a partial index (``WHERE status = …``),
keyed for scans of that status (by consumer and due time, by consumer and update time). A
lookup of one row by its primary key that also tests its status lets PostgreSQL answer from
that status's partial index instead, and with statistics taken before a backlog of that status
it does: it reads the whole partial index, and filters on the id, to find one row (5 ms at
50,000 waiting rows, for each row a gap sweep looks at). :func:`with_status` writes the test
in the ``"C"`` collation on PostgreSQL, so that it matches no index's predicate and the
primary key answers. Equality in ``"C"`` is byte equality: the same rows. The hand-written
statements use the same test (:func:`~django_inbox.db.statements.common.status_exactly`).
"""

from __future__ import annotations

from typing import TypeVar, cast

from django.db import connections
from django.db.models import Model, QuerySet
from django.db.models.functions import Collate

M = TypeVar("M", bound=Model)


def with_status(rows: QuerySet[M], *statuses: str) -> QuerySet[M]:
    """``rows`` whose ``status`` is one of ``statuses``, tested so that no partial index
    answers it on PostgreSQL (a plain ``status__in`` elsewhere)."""
    if connections[rows.db].vendor != "postgresql":
        return rows.filter(status__in=statuses)
    exact = rows.alias(status_exactly=Collate("status", "C"))
    return cast("QuerySet[M]", exact.filter(status_exactly__in=statuses))
