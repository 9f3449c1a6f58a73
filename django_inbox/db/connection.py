"""The inbox's own database connection in long-running processes: keep it, notice when it is
lost, and tell a lost database from a handler's error.

Django closes connections at the end of each request; a worker has no requests.
``close_old_connections()`` on every pass would, under ``CONN_MAX_AGE = 0`` (Django's default),
open a new connection for every batch or message, and a worker would be the first to fail
when connection slots run out. :func:`keep_connection` keeps the inbox's connection while it
works and closes it only when it is broken or older than a positive ``CONN_MAX_AGE``.

A database that restarts, refuses connections or drops one is *infrastructure*: it is not
the handler's fault, so it must not use up a message's attempts (:func:`connection_lost`).
Waiting for it with backoff, and telling it from a database that refuses the connection for
its settings, is :mod:`django_inbox.db.outage`.
"""

from __future__ import annotations

import time
from typing import Any

from django.db import DatabaseError, InterfaceError, connections

from .. import clock
from . import preparing

#: SQLSTATEs that close the connection but are the handler's doing: it sat idle inside its
#: transaction longer than ``idle_in_transaction_session_timeout`` (or the session timeout).
HANDLER_TIMEOUTS = ("25P03", "57P05")
#: SQLSTATEs of a server that ends the connection or refuses one: shutdown or restart
#: (57P01, also what ``pg_terminate_backend`` sends), crash (57P02), still starting (57P03),
#: no connection slot left (53300); and the whole class 08, connection exceptions.
CONNECTION_ENDED = ("57P01", "57P02", "57P03", "53300")
#: MySQL's and MariaDB's error codes of a connection that ended or was refused: can't connect
#: (2002, 2003), server gone away (2006), lost during a query (2013) or at its start (2055),
#: killed (1927, ``KILL CONNECTION`` on MariaDB), server shutting down (1053), no connection
#: slot left (1040, and 1203 for the user's own limit).
MYSQL_CONNECTION_ENDED = frozenset({1040, 1053, 1203, 1927, 2002, 2003, 2006, 2013, 2055})
#: Every other code of the server (below 2000, 3000 and above) is an error it answered with:
#: the connection is alive and the attempt was the handler's. Among them MySQL 8.0.24+'s 4031,
#: a session disconnected for idling past ``wait_timeout`` (a handler sitting in its
#: transaction, as PostgreSQL's ``idle_in_transaction_session_timeout``). MariaDB ends such a
#: session (``wait_timeout``, ``idle_transaction_timeout``) with 2006 or 2013, which read as a
#: lost connection: no attempt is used, and the cap on interrupted attempts
#: (:mod:`django_inbox.processing.interruptions`) stops a handler that idles every time.


#: SQLSTATEs of a server out of a resource: its disk is full (53100, "could not extend file"),
#: it is out of memory (53200) or of another resource (53000). The server answered and the
#: connection is alive, but the attempt is cut short by the infrastructure, not the handler,
#: so it is treated as an outage (:func:`connection_lost`): no attempt is used up, and the
#: process waits with backoff until its work goes through again.
RESOURCES_EXHAUSTED = ("53000", "53100", "53200")
#: MySQL's and MariaDB's: disk full (1021), a table full (1114, also a full disk under InnoDB),
#: out of memory (1037) or of resources (1041).
MYSQL_RESOURCES_EXHAUSTED = frozenset({1021, 1037, 1041, 1114})


def out_of_resources(exc: BaseException) -> bool:
    """Whether ``exc`` is the database running out of disk, memory or another resource
    (:data:`RESOURCES_EXHAUSTED`)."""
    found = mysql_error(exc)
    if found is not None:
        return found[0] in MYSQL_RESOURCES_EXHAUSTED
    return sqlstate(exc) in RESOURCES_EXHAUSTED


#: Conflicts between transactions, and statements that ran out of time, which end a statement
#: or its transaction but leave the connection usable: a deadlock (PostgreSQL 40P01, MySQL and
#: MariaDB 1213), a serialisation failure (40001), a lock waited for past ``lock_timeout``
#: (55P03; 1205), a statement cancelled by ``statement_timeout`` or an operator's
#: ``pg_cancel_backend`` (57014; MariaDB's ``max_statement_time`` 1969, MySQL's
#: ``max_execution_time`` 3024).
CONFLICT_STATES = ("40P01", "40001", "55P03", "57014")
MYSQL_CONFLICTS = frozenset({1205, 1213, 1969, 3024})


def conflicted(exc: BaseException) -> bool:
    """Whether ``exc`` is a conflict with another transaction or a statement that ran out of
    time (:data:`CONFLICT_STATES`). In a handler's own code it is the handler's failed attempt
    (a query that times out every time ends ``dead``); in the inbox's own statements (a
    worker's claim and completion, a gap sweep, a shared batch's commit, the relay's claim) it
    is no one's: nothing of them committed, and they are tried again."""
    found = mysql_error(exc)
    if found is not None:
        return found[0] in MYSQL_CONFLICTS
    return sqlstate(exc) in CONFLICT_STATES


def keep_connection(using: str) -> None:
    """Between units of work: close ``using``'s connection only if it is broken or older than
    a positive ``CONN_MAX_AGE``; give every other alias Django's usual treatment. Then, every
    :data:`~django_inbox.clock.REFRESH` seconds, measure this host's clock against the
    database's (:mod:`django_inbox.clock`), which leases are computed on."""
    _keep(using)
    if not connections[using].in_atomic_block:
        clock.refresh(using)


def _keep(using: str) -> None:
    for connection in connections.all(initialized_only=True):
        if connection.alias != using:
            connection.close_if_unusable_or_obsolete()
            continue
        if connection.connection is None or connection.in_atomic_block:
            continue
        if _broken(connection):
            drop_connection(using)
            continue
        max_age = connection.settings_dict.get("CONN_MAX_AGE") or 0
        opened = getattr(connection, "_inbox_opened", None)
        if opened is None:
            connection._inbox_opened = time.monotonic()  # type: ignore[attr-defined]
        elif max_age and time.monotonic() - opened >= max_age:
            drop_connection(using)


def drop_connection(using: str) -> None:
    """Close ``using``'s connection, broken or not; the next query opens a new one."""
    connection = connections[using]
    try:
        connection.close()
    except Exception:  # closing a dead connection may fail; it is gone either way
        connection.connection = None
    connection._inbox_opened = None  # type: ignore[attr-defined]


def _broken(connection: Any) -> bool:
    """Whether the connection can no longer be used, judged without a round trip."""
    raw = connection.connection
    if raw is None:
        return False  # not opened yet: the next query connects
    if connection.vendor != "postgresql":
        return bool(connection.errors_occurred and not connection.is_usable())
    if getattr(raw, "broken", False):  # psycopg 3
        return True
    return bool(raw.closed)


def sqlstate(exc: BaseException) -> str | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        state = getattr(current, "sqlstate", None) or getattr(current, "pgcode", None)
        if state:
            return str(state)
        current = current.__cause__ or current.__context__
    return None


def mysql_error(exc: BaseException) -> tuple[int, str] | None:
    """The MySQL or MariaDB error code of ``exc`` or what caused it, with the server's message
    from the same exception: ``mysqlclient`` and Django's wrappers of its errors carry them as
    their arguments, MySQL Connector/Python as ``errno`` and ``msg``. ``None`` for others."""
    for current in _chain(exc):
        module = type(current).__module__
        if module.startswith("mysql.connector"):
            code = getattr(current, "errno", None)
            if isinstance(code, int):
                return code, str(getattr(current, "msg", "") or current)
            continue
        args = getattr(current, "args", ())
        if (
            module.startswith(("MySQLdb", "django.db"))
            and args
            and isinstance(args[0], int)
            and not isinstance(args[0], bool)
        ):
            return args[0], str(args[1]) if len(args) > 1 else str(current)
    return None


def connection_lost(exc: BaseException, using: str) -> bool:
    """Whether ``exc`` came with the loss of the inbox's database connection.

    True when ``using``'s connection is unusable after the error (server shutdown or restart,
    a terminated backend, a dropped network connection, no connection slot left), unless the
    server closed it because the handler sat idle in its transaction past a timeout. The
    attempt that was running is then not the handler's failure. A statement timeout, a lock
    timeout, a deadlock or a serialisation failure leave the connection usable: they count as
    the handler's failed attempt, so a query that times out every time ends ``dead``. So does
    a transaction lost to a prepared statement the server no longer knows (see
    :mod:`django_inbox.db.preparing`): the connection is fine, the attempt was not the
    handler's. Nor is a server out of disk or memory (:func:`out_of_resources`): it is
    waited for like a lost connection.
    """
    if lost_prepared_statement(exc) or out_of_resources(exc):
        return True
    found = mysql_error(exc) if connections[using].vendor == "mysql" else None
    if found is not None:
        code = found[0]
        if code in MYSQL_CONNECTION_ENDED:
            return True  # the driver may not have noticed yet that the connection is gone
        if not 2000 <= code < 3000:
            return False  # the server answered with an error: the connection is alive
    state = sqlstate(exc)
    if state in HANDLER_TIMEOUTS:
        return False
    if state is not None and (state in CONNECTION_ENDED or state.startswith("08")):
        return True  # the driver may not have noticed yet that the connection is gone
    if state is None and _client_side(exc):
        return True  # the socket closed, a connect failed: no server ever answered
    # Judged from the error alone where possible: by now a later query (a rollback, a check)
    # may already have opened a new, healthy connection.
    connection = connections[using]
    if connection.connection is None:
        # Never connected, or closed already: a failed connect (refused, no slot left).
        return isinstance(exc, DatabaseError) or _caused_by_database(exc)
    return _broken(connection)


def lost_prepared_statement(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) aborted a transaction because a prepared statement
    was gone or stale (:mod:`~django_inbox.db.preparing`): the connection's fault, not the
    handler's."""
    return any(getattr(current, preparing.MARK, False) for current in _chain(exc))


def _client_side(exc: BaseException) -> bool:
    """An ``InterfaceError``, or a driver's ``OperationalError`` without an SQLSTATE: the
    driver lost (or never had) the connection; the server sent no error."""
    for current in _chain(exc):
        if isinstance(current, InterfaceError):
            return True
        kind = type(current)
        if kind.__module__.startswith(("psycopg", "psycopg2")) and kind.__name__ in (
            "OperationalError",
            "InterfaceError",
        ):
            return True
    return False


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _caused_by_database(exc: BaseException) -> bool:
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DatabaseError) or type(current).__module__.startswith(
            ("psycopg", "psycopg2", "sqlite3", "MySQLdb")
        ):
            return True
        current = current.__cause__ or current.__context__
    return False


def table_exists(using: str, table: str) -> bool:
    """Whether ``table`` exists in ``using``'s database (raises if the database is down)."""
    connection = connections[using]
    with connection.cursor() as cursor:
        return table in connection.introspection.table_names(cursor)


def describe(exc: BaseException) -> str:
    """A database error for a log line: its type, SQLSTATE and first line (which, for the
    errors that end a connection, holds no data)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    state = sqlstate(exc)
    return f"{type(exc).__name__}{f' {state}' if state else ''}: {first[:200]}"


_PQ_TRANSACTION_INERROR = 3  # the same value in psycopg 3 and psycopg2


def transaction_aborted(using: str) -> bool:
    """Whether the current transaction can no longer commit (checked without a round trip)."""
    connection = connections[using]
    if connection.needs_rollback:
        return True
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    raw = connection.connection
    info = getattr(raw, "info", None)
    status = info.transaction_status if info is not None else raw.get_transaction_status()
    return int(status) == _PQ_TRANSACTION_INERROR
