"""What the statement modules share: quoting, the table, status literals, the row shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections

from ...models import InboxMessage
from ..identity import digest_params, digest_sql

Status = InboxMessage.Status

COLUMNS = (
    "consumer",
    "message_id",
    "source",
    "event_type",
    "key",
    "sequence",
    "payload",
    "headers",
    "status",
    "attempts",
    "last_error",
    "history",
    "received_at",
    "updated_at",
    "next_attempt_at",
    "locked_until",
    "lease_id",
    "processed_at",
    "rerun",
    "skip_requested",
)
JSON_COLUMNS = {"payload", "headers", "history"}
#: SQL text built once per database and shape.
sql_cache: dict[tuple[Any, ...], str] = {}


@dataclass
class NewRow:
    """A validated message, ready to insert. JSON fields hold encoded text."""

    consumer: str
    message_id: str
    event_type: str
    payload: str
    headers: str = "{}"
    source: str = ""
    key: str = ""
    sequence: int | None = None
    status: str = Status.RECEIVED
    attempts: int = 0
    last_error: str = ""
    history: str = "[]"
    next_attempt_at: datetime | None = None
    locked_until: datetime | None = None
    lease_id: str = ""
    processed_at: datetime | None = None
    rerun: bool = False
    skip_requested: bool = False


def cached_sql(using: str, name: object, build: Callable[[Any, str], str]) -> str:
    """The SQL of statement ``name`` on ``using``: ``build(quote, table)`` the first time."""
    key = (using, connections[using].vendor, name)
    sql = sql_cache.get(key)
    if sql is None:
        sql = sql_cache[key] = build(quote_of(using), table_of(using))
    return sql


def quote_of(using: str) -> Any:
    return connections[using].ops.quote_name


def table_of(using: str) -> str:
    return str(quote_of(using)(InboxMessage._meta.db_table))


def identity_sql(quote: Any, vendor: str) -> str:
    """``WHERE`` SQL of one message by ``(consumer, message_id)``, its parameters from
    :func:`identity_params`. On PostgreSQL it compares the digest the unique index holds
    (:mod:`django_inbox.db.identity`), then the two columns."""
    pair = f"{quote('consumer')} = %s AND {quote('message_id')} = %s"
    if vendor != "postgresql":
        return pair
    column = digest_sql(quote("consumer"), quote("message_id"))
    return f"{column} = {digest_sql('%s', '%s')} AND {pair}"


#: The unique constraint on the pair that migration 0011 drops on PostgreSQL.
PAIR_CONSTRAINT = "django_inbox_unique_consumer_message"
#: Whether the pair's constraint is still on the table, by database alias (looked up once).
_pair_constraint: dict[str, bool] = {}


def conflict_target(quote: Any, vendor: str, using: str) -> str:
    """The ``ON CONFLICT`` target of the inbox's inserts: the unique index of identities on
    PostgreSQL (its expression, which is how PostgreSQL infers an expression index), the
    unique constraint elsewhere. Named, so that a conflict on any other unique index (the
    primary key after a careless restore, an index a user added) raises instead of passing
    for a duplicate and losing the message.

    Between migrations 0010 and 0011 PostgreSQL holds both the digest index and the pair's
    constraint. An insert that names only the digest index would then meet a concurrent
    duplicate at the constraint as an error (a unique violation, not a duplicate), so while
    the constraint is there the target is left out and any unique index decides, as in the
    releases before 0010. Looked up once per process and database: a process that saw the
    constraint keeps leaving the target out after 0011 (still correct) until it restarts; a
    process whose target no longer matches (a migration reversed under it) looks it up again
    at its first failed insert (:func:`identity_index_changed`)."""
    if vendor != "postgresql":
        return f"({quote('consumer')}, {quote('message_id')})"
    if pair_constraint_exists(using):
        return ""
    return f"(({digest_sql(quote('consumer'), quote('message_id'))}))"


class IdentityIndexChanged(DatabaseError):
    """The unique index that deduplicates was built or dropped under this running process (a
    migration applied or reversed: see the upgrading how-to). The insert's ``ON CONFLICT``
    target has been looked up again; sent again, the statement succeeds. Nothing committed."""


#: SQLSTATE of "no unique or exclusion constraint matching the ON CONFLICT specification".
NO_CONFLICT_TARGET = "42P10"
UNIQUE_VIOLATION = "23505"


def identity_index_changed(exc: BaseException, using: str) -> None:
    """Raise :class:`IdentityIndexChanged` if ``exc``, raised by an insert, says the table's
    identity index is not the one this process looked up: the digest index it names is gone
    (0010 reversed), or the pair's constraint it left out is back (0011 reversed) and met a
    concurrent duplicate. The lookup is forgotten first, so every statement after it is
    built for the table as it is now."""
    cause = exc.__cause__ or exc
    sqlstate = getattr(cause, "sqlstate", None)
    named = getattr(getattr(cause, "diag", None), "constraint_name", None)
    if sqlstate == NO_CONFLICT_TARGET or (
        sqlstate == UNIQUE_VIOLATION
        and named == PAIR_CONSTRAINT
        and _pair_constraint.get(using) is False
    ):
        _pair_constraint.pop(using, None)
        for key in [key for key in sql_cache if key[0] == using]:
            del sql_cache[key]
        raise IdentityIndexChanged(
            "the inbox's unique index changed under this process (a migration of django_inbox "
            "was applied or reversed while it ran); the statement is built again"
        ) from exc


def pair_constraint_exists(using: str) -> bool:
    """Whether the table still has the pair's unique constraint (PostgreSQL before 0011)."""
    found = _pair_constraint.get(using)
    if found is None:
        with connections[using].cursor() as cursor:
            cursor.execute(
                "SELECT EXISTS (SELECT FROM pg_constraint WHERE conname = %s "
                "AND conrelid = to_regclass(%s))",
                [PAIR_CONSTRAINT, table_of(using)],
            )
            found = _pair_constraint[using] = bool(cursor.fetchone()[0])
    return found


def identity_params(consumer: str, message_id: str, vendor: str = "postgresql") -> list[str]:
    """The parameters of :func:`identity_sql`."""
    pair = [consumer, message_id]
    return [*digest_params(consumer, message_id), *pair] if vendor == "postgresql" else pair


def status_literal(value: str) -> str:
    """A status as an SQL literal (only the model's own values are ever written so)."""
    return f"'{Status(value).value}'"


def status_exactly(quote: Any, vendor: str = "postgresql") -> str:
    """The ``status`` column as a test that must match no partial index's predicate names it:
    in the ``"C"`` collation on PostgreSQL, for a statement that finds its rows by another
    index (a primary key, a message id, a key's version). A plain status test lets PostgreSQL
    answer from the partial index of that status, which with statistics from before a backlog
    it does, reading the whole backlog to find a few rows. Equality in ``"C"`` is byte
    equality, the same answer. Other databases have no partial indexes to avoid."""
    column = quote("status")
    return f'({column} COLLATE "C")' if vendor == "postgresql" else column


def status_aside(quote: Any, *statuses: str) -> str:
    """``status IN (…)`` as :func:`status_exactly` writes it (PostgreSQL)."""
    literals = ", ".join(status_literal(status) for status in statuses)
    return f"{status_exactly(quote)} IN ({literals})"


def fence(lease_id: str) -> str:
    """A fenced statement's lease id. An empty one is refused: it would match every row that
    no claim holds (a ``completed`` or ``dead`` one too), since the lease is the whole fence."""
    if not lease_id:
        raise ValueError("a fenced change of a claimed row needs its claim's lease id")
    return lease_id
