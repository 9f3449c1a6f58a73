"""Server-side prepared statements for the inbox's own statements (PostgreSQL, psycopg 3).

Django turns psycopg's prepared statements off (``prepare_threshold = None``) and binds
parameters on the client unless ``OPTIONS`` say otherwise: every statement is then parsed and
planned again, and its parameters are quoted into the text by Python. The inbox's hot
statements (the insert that deduplicates, the claim, the fenced completion, a duplicate's
status) run thousands of times a second with the same text, so :func:`cursor` gives them a
server-binding cursor that prepares a statement the second time it is sent on the same
connection. Counted per connection, not per process: where connections are short-lived
(Celery closes Django's connections around every task; ``CONN_MAX_AGE = 0`` closes them after
every request) a statement sent once per connection is never prepared, since preparing costs
a round trip of its own that only a second use repays. The user's own queries are left as
their ``DATABASES`` settings say.

It stays off where it cannot be correct, and turns itself off where it turns out not to be:

- ``INBOX_PREPARED_STATEMENTS = False``, ``OPTIONS = {"prepare_threshold": None}`` written out
  in the settings, psycopg 2, or a backend with its own cursor (a wrapping backend) keep
  Django's plain cursor.
- A connection pooler that does not carry prepared statements (PgBouncer before 1.22, or
  without ``max_prepared_statements``, in transaction mode) answers "prepared statement …
  does not exist" (26000) or "… already exists" (42P05); a schema change answers "cached plan
  must not change result type" (0A000). The first such answer stops preparing for the whole
  process, with a warning. Outside a transaction the statement is sent again unprepared;
  inside one, the transaction is lost: the error carries :data:`MARK`, and
  :func:`~django_inbox.db.connection.connection_lost` takes it for infrastructure, so the
  attempt is not counted against the message.
- Statement names jump to a random number on each connection the inbox uses, so that two
  processes whose statements a pooler mixes up on one server connection do not reuse each
  other's names.

psycopg forgets every prepared statement of a connection at a ``ROLLBACK`` (a handler's
failure, a savepoint rolled back) and sends ``DEALLOCATE ALL``; the inbox's statements are
prepared again on their next use. Tools that instrument psycopg's cursor factory do not see
these statements (Django's ``execute_wrapper`` hooks do).
"""

from __future__ import annotations

import logging
import random
import weakref
from typing import Any

from django.db import connections

from ..conf import inbox_settings

logger = logging.getLogger("django_inbox")

#: A statement text is prepared the time it is sent this often on one connection.
PREPARE_AFTER = 2
#: SQLSTATEs saying prepared statements do not work here: the name is unknown to this server
#: connection (26000), or taken by another statement (42P05).
GONE = ("26000", "42P05")
#: "cached plan must not change result type": the table changed under a prepared statement.
STALE = "0A000"
#: How many statement texts are counted before the count starts again (shapes are few).
_MAX_SEEN = 512
#: A psycopg exception gets this attribute when it came from a lost prepared statement.
MARK = "inbox_prepared_statement_lost"


class _State:
    """What this process has learned: whether preparing was stopped, and what was sent."""

    def __init__(self) -> None:
        self.stopped = False
        #: Statement texts this process sent through a preparing cursor, and how often (on
        #: every connection together).
        self.seen: dict[str, int] = {}
        #: Connections seen, with the Django time zone they were last used with, whether
        #: their own ``timestamptz`` loader reads another one, and the statement texts sent
        #: on them with how often.
        self.adopted: weakref.WeakKeyDictionary[Any, tuple[Any, bool, dict[str, int]]] = (
            weakref.WeakKeyDictionary()
        )

    def reset(self) -> None:
        self.stopped = False
        self.seen.clear()
        _plain_kinds.clear()
        self.adopted = weakref.WeakKeyDictionary()


state = _State()

try:  # psycopg 3 is optional: without it (psycopg 2, SQLite, MySQL) nothing is prepared
    import psycopg
    from psycopg import pq

    class PreparingCursor(psycopg.Cursor[Any]):
        """A server-binding cursor that prepares a statement from its :data:`PREPARE_AFTER`
        th use on its connection, and stops preparing when the server says it cannot."""

        #: Statement texts sent on this cursor's connection, and how often (set by
        #: :func:`cursor`).
        sent: dict[str, int]

        def execute(
            self,
            query: Any,
            params: Any = None,
            *,
            prepare: bool | None = None,
            binary: bool | None = None,
        ) -> PreparingCursor:
            if state.stopped:
                return super().execute(query, params, prepare=False, binary=binary)
            seen, sent = state.seen, self.sent
            if len(seen) >= _MAX_SEEN and query not in seen:
                seen.clear()
            if len(sent) >= _MAX_SEEN and query not in sent:
                sent.clear()
            seen[query] = seen.get(query, 0) + 1
            sent[query] = count = sent.get(query, 0) + 1
            try:
                return super().execute(query, params, prepare=count >= PREPARE_AFTER, binary=binary)
            except psycopg.Error as exc:
                if not _prepared_statement_trouble(exc):
                    raise
                _stop(exc)
                if self.connection.info.transaction_status == pq.TransactionStatus.IDLE:
                    # Autocommit, nothing lost: send it again, unprepared.
                    return super().execute(query, params, prepare=False, binary=binary)
                setattr(exc, MARK, True)
                raise

    _AVAILABLE = True
except ImportError:  # pragma: no cover - psycopg 2 only
    _AVAILABLE = False


def _prepared_statement_trouble(exc: BaseException) -> bool:
    state_code = getattr(exc, "sqlstate", None)
    if state_code in GONE:
        return True
    return state_code == STALE and "cached plan" in str(exc)


def _stop(exc: BaseException) -> None:
    if not state.stopped:
        state.stopped = True
        logger.warning(
            "django_inbox: the database refused a prepared statement (%s %s); the inbox stops "
            "preparing its statements in this process. Behind PgBouncer in transaction mode, "
            "use PgBouncer 1.22 or later with max_prepared_statements, or set "
            "INBOX_PREPARED_STATEMENTS = False.",
            getattr(exc, "sqlstate", ""),
            str(exc).strip().splitlines()[0][:200] if str(exc).strip() else "",
        )


def enabled(using: str) -> bool:
    """Whether the inbox prepares its statements on ``using``'s connections."""
    return _enabled(connections[using])


def _enabled(connection: Any) -> bool:
    if not _AVAILABLE or state.stopped or not inbox_settings.prepared_statements:
        return False
    if connection.vendor != "postgresql" or not _plain_backend(connection):
        return False
    options = connection.settings_dict.get("OPTIONS") or {}
    # Written out as None, prepare_threshold is the user saying "no prepared statements".
    return not ("prepare_threshold" in options and options["prepare_threshold"] is None)


#: :func:`_plain_backend`'s answer by backend class: looked at once per class, so a class
#: patched after its first statement keeps its first answer (``state.reset()`` forgets them).
_plain_kinds: dict[type, bool] = {}


def _plain_backend(connection: Any) -> bool:
    """Django's own psycopg 3 backend, not one that wraps or creates its cursors itself."""
    kind: Any = type(connection)
    plain = _plain_kinds.get(kind)
    if plain is None:
        plain = _plain_kinds[kind] = _plain_kind(kind)
    return plain


def _plain_kind(kind: Any) -> bool:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.postgresql import base as postgresql
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    base: Any = BaseDatabaseWrapper
    return bool(
        is_psycopg3
        and getattr(kind, "create_cursor", None) is postgresql.DatabaseWrapper.create_cursor
        and getattr(kind, "_cursor", None) is base._cursor
        and getattr(kind, "_prepare_cursor", None) is getattr(base, "_prepare_cursor", 0)
    )


def cursor(using: str) -> Any:
    """A cursor for one of the inbox's own statements on ``using``: Django's usual wrapper
    (``execute_wrapper`` hooks, error translation) around a cursor that prepares, where
    :func:`enabled`; Django's plain cursor elsewhere, and while Django logs queries (``DEBUG``,
    ``assertNumQueries``), so that the log shows each statement with its values."""
    connection: Any = connections[using]
    if not _enabled(connection) or connection.queries_logged:
        return connection.cursor()
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    raw = connection.connection
    zone = connection.timezone
    seen = state.adopted.get(raw)
    if seen is None:
        _adopt(connection, raw)
    if seen is None or seen[0] is not zone:
        sent: dict[str, int] = {} if seen is None else seen[2]
        seen = state.adopted[raw] = (zone, _other_time_zone(raw, zone), sent)
    with connection.wrap_database_errors:
        created = PreparingCursor(raw)
        created.sent = seen[2]
        if seen[1]:
            _register_time_zone(zone, created)
        return connection._prepare_cursor(created)


def _adopt(connection: Any, raw: Any) -> None:
    """Once per connection: let explicit ``prepare=True`` work under Django's default
    ``prepare_threshold = None`` (a threshold nobody reaches prepares nothing else), and move
    the statement names on by a random number."""
    if raw.prepare_threshold is None:
        raw.prepare_threshold = 2**31
    manager = getattr(raw, "_prepared", None)
    if manager is not None and isinstance(getattr(manager, "_prepared_idx", None), int):
        manager._prepared_idx += random.randrange(1 << 40)  # the counter only grows: no reuse


def _other_time_zone(raw: Any, zone: Any) -> bool:
    """Whether ``raw`` reads ``timestamptz`` values in another time zone than ``zone``, the
    Django connection's (a cursor then needs its own loader, as Django's cursors get)."""
    from django.db.backends.postgresql.base import TIMESTAMPTZ_OID

    return bool(raw.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT).timezone != zone)


def _register_time_zone(zone: Any, created: Any) -> None:
    from django.db.backends.postgresql.psycopg_any import register_tzloader

    register_tzloader(zone, created)
