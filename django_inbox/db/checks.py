"""The system checks of the inbox's database: it must be in ``DATABASES``, with real
transactions (E008, E009), on an engine the guarantees are tested on (W002; MySQL itself is
told from MariaDB by asking the server), keep its workers' connections long enough (W004),
store any text (W005, asked of the server), on SQLite let several processes take turns
writing (W006), on MariaDB and MySQL read what other transactions committed (W007), and
behind a pooler such as PgBouncer neither prepare statements nor hold cursors (W012).
Tagged ``database``; W005, W012 and MySQL's W002 are asked of the server, so they run when checks
run for the database (``migrate``, ``check --database``), the others with a plain
``manage.py check``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from ..conf import DEFAULTS

#: The engines the suite proves the guarantees on (MariaDB's backend is Django's ``mysql``).
SUPPORTED_VENDORS = ("postgresql", "sqlite", "mysql")


@register(Tags.database)
def check_database(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """The inbox's promise needs real transactions on the database its rows live in."""
    alias = getattr(settings, "INBOX_DATABASE", DEFAULTS["INBOX_DATABASE"])
    databases = settings.DATABASES
    if alias not in databases:
        return [
            Error(
                f"INBOX_DATABASE is {alias!r}, which is not in DATABASES.",
                id="django_inbox.E008",
            )
        ]
    config = databases[alias]
    errors: list[CheckMessage] = []
    if config.get("AUTOCOMMIT", True) is False:
        errors.append(
            Error(
                f"DATABASES[{alias!r}] sets AUTOCOMMIT = False, which turns off Django's "
                "transaction management; the inbox cannot commit a message with its effects.",
                id="django_inbox.E009",
            )
        )
    engine = str(config.get("ENGINE", ""))
    if "mysql" in engine:
        options = config.get("OPTIONS", {}) or {}
        init = str(options.get("init_command", "")).lower()
        if "myisam" in init:
            errors.append(
                Error(
                    f"DATABASES[{alias!r}] uses MyISAM, which has no transactions.",
                    id="django_inbox.E009",
                )
            )
    if not any(vendor in engine for vendor in SUPPORTED_VENDORS):
        errors.append(_untested(alias, repr(engine)))
    errors += _reconnecting(alias, config, engine)
    errors += _sqlite_writers(alias, config, engine)
    errors += _isolation(alias, config, engine)
    if alias in (kwargs.get("databases") or ()):
        errors += _encoding(alias)
        errors += _mysql_itself(alias)
        errors += _pooler(alias, config)
    return errors


def _untested(alias: str, what: str) -> Warning:
    return Warning(
        f"DATABASES[{alias!r}] uses {what}. The inbox's guarantees are tested on PostgreSQL "
        "and MariaDB, and SQLite is supported for development and demos; other engines are "
        "untested.",
        id="django_inbox.W002",
    )


def _mysql_itself(alias: str) -> list[CheckMessage]:
    """W002 for MySQL: Django's ``mysql`` backend serves MariaDB and MySQL, and only MariaDB
    is on the machines the suite runs on. Asked of the server."""
    from django.db import DatabaseError, connections

    connection: Any = connections[alias]  # Django's MySQL wrapper, when the vendor says so
    if connection.vendor != "mysql":
        return []
    try:
        if connection.mysql_is_mariadb:
            return []
        version = ".".join(map(str, connection.mysql_version))
    except DatabaseError:
        return []  # unreachable: other checks and commands say so
    return [_untested(alias, f"MySQL {version}")]


#: The isolation level the inbox needs on MariaDB and MySQL (Django's default there).
ISOLATION = "read committed"


def _isolation(alias: str, config: dict[str, Any], engine: str) -> list[CheckMessage]:
    """W007: MariaDB and MySQL transactions at another level than ``READ COMMITTED``.

    Django sets ``READ COMMITTED`` unless ``OPTIONS['isolation_level']`` says otherwise.
    ``REPEATABLE READ`` (the servers' own default, which ``None`` keeps) locks the gaps
    between the index entries a locking read passes: with 4 workers of an ordered consumer on
    MariaDB a worker's claim ended in a deadlock (1213; the worker tries again). (The duplicate
    checks held there: the inbox re-reads the pair with a locking read, which sees what other
    transactions committed whatever the level.) ``SERIALIZABLE`` makes every read take shared
    locks; ``READ UNCOMMITTED`` shows rows whose transaction may still roll back."""
    if "mysql" not in engine:
        return []
    options = config.get("OPTIONS", {}) or {}
    level = options.get("isolation_level", ISOLATION)
    if isinstance(level, str) and level.lower() == ISOLATION:
        return []
    said = (
        "the server's default (REPEATABLE READ unless it was changed)"
        if not level
        else (f"{str(level).upper()}")
    )
    return [
        Warning(
            f"DATABASES[{alias!r}] runs its transactions at {said}: the inbox's duplicate "
            "checks, claims and fenced updates are proven at READ COMMITTED.",
            hint="Remove OPTIONS['isolation_level'] (Django's default is READ COMMITTED), or "
            "set it to 'read committed'.",
            id="django_inbox.W007",
        )
    ]


def _sqlite_writers(alias: str, config: dict[str, Any], engine: str) -> list[CheckMessage]:
    """W006: on SQLite, several processes (a worker and ``deliver()`` from a web process, or
    two workers) share one writer. A transaction that begins by reading and later writes
    cannot wait for the write lock (SQLite answers ``database is locked`` at once): with
    ``transaction_mode`` ``IMMEDIATE`` each transaction takes the lock when it begins, and
    waits up to ``timeout`` for it."""
    if "sqlite" not in engine:
        return []
    options = config.get("OPTIONS", {}) or {}
    if str(options.get("transaction_mode", "")).upper() == "IMMEDIATE":
        return []
    return [
        Warning(
            f"DATABASES[{alias!r}] is SQLite without OPTIONS['transaction_mode'] = 'IMMEDIATE': "
            "a worker and any other process writing the inbox (deliver() from a web process, "
            "another worker) fail with 'database is locked' instead of taking turns.",
            hint="Set OPTIONS = {'transaction_mode': 'IMMEDIATE', 'timeout': 30} on it, or run "
            "one process only.",
            id="django_inbox.W006",
        )
    ]


def _encoding(alias: str) -> list[CheckMessage]:
    """W005: a PostgreSQL database whose encoding is not UTF-8 refuses text outside it (an
    emoji in a payload) with a ``DataError``: not a ``ValueError`` the caller can tell from an
    outage, so a broker consumer requeues such a message again and again. Asked of the server
    only when checks run for this database (``migrate``, ``check --database``)."""
    from django.db import DatabaseError, connections

    from .statements import server_encoding

    if connections[alias].vendor != "postgresql":
        return []
    try:
        encoding = server_encoding(alias)
    except DatabaseError:
        return []  # unreachable: other checks and commands say so
    if encoding.upper().replace("-", "") == "UTF8":
        return []
    return [
        Warning(
            f"The database of DATABASES[{alias!r}] is encoded in {encoding}, not UTF-8: "
            "messages with text outside it cannot be stored.",
            hint=(
                "deliver() and store() raise DataError for them, and inbox_consume requeues "
                "them again and again. Create the database with ENCODING 'UTF8'."
            ),
            id="django_inbox.W005",
        )
    ]


#: Below this ``CONN_MAX_AGE`` (seconds), W004 says workers reconnect too often.
RECONNECT_WARNING_SECONDS = 60


def _reconnecting(alias: str, config: dict[str, Any], engine: str) -> list[CheckMessage]:
    """W004: a ``CONN_MAX_AGE`` that makes long-running inbox commands reconnect often.

    They keep their connection while it is healthy under ``0`` (Django's default) and
    ``None``; a positive number still ends it at that age. On PostgreSQL each new connection
    is a new server process, and the inbox's prepared statements are prepared again.
    """
    max_age = config.get("CONN_MAX_AGE", 0)
    if "postgresql" not in engine or isinstance(max_age, bool):
        return []
    if not isinstance(max_age, int | float) or not 0 < max_age < RECONNECT_WARNING_SECONDS:
        return []
    return [
        Warning(
            f"DATABASES[{alias!r}] sets CONN_MAX_AGE = {max_age!r}: inbox_process and "
            f"inbox_consume reconnect every {max_age!r} seconds.",
            hint=(
                "Workers keep their connection while it is healthy under CONN_MAX_AGE = 0 "
                "(Django's default) or None. Use one of those, or at least "
                f"{RECONNECT_WARNING_SECONDS} seconds, in the settings the workers run with."
            ),
            id="django_inbox.W004",
        )
    ]


def _pooler(alias: str, config: dict[str, Any]) -> list[CheckMessage]:
    """W012: a PostgreSQL reached through a proxy or a connection pooler (the server listens
    on another port than the one connected to), with the inbox's prepared statements on or
    Django's server-side cursors allowed. PgBouncer in transaction mode (before 1.22, or
    without ``max_prepared_statements``) hands each transaction another server connection:
    a statement prepared on one is unknown on the next, and a cursor kept open between
    transactions (``.iterator()`` outside a transaction) is gone. The inbox notices the first
    (it stops preparing, with a warning, and a transaction that met it is not counted against
    its message); this says so before it happens. Asked of the server, like W005."""
    from django.db import DatabaseError, connections

    from ..conf import inbox_settings

    connection: Any = connections[alias]
    if connection.vendor != "postgresql":
        return []
    try:
        connection.ensure_connection()
        connected = int(connection.connection.info.port)
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('port')::int")
            listening = int(cursor.fetchone()[0])
    except (DatabaseError, AttributeError, TypeError, ValueError):
        return []  # unreachable or not psycopg 3: other checks and commands say so
    if connected == listening:
        return []
    wrong = []
    if inbox_settings.prepared_statements:
        wrong.append("INBOX_PREPARED_STATEMENTS = False")
    if not config.get("DISABLE_SERVER_SIDE_CURSORS", False):
        wrong.append(f"DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True")
    if not wrong:
        return []
    return [
        Warning(
            f"DATABASES[{alias!r}] connects to port {connected}, and the PostgreSQL server "
            f"behind it listens on {listening}: a proxy or a connection pooler is in between. "
            "In transaction mode (PgBouncer's, before 1.22 or without "
            "max_prepared_statements) it needs " + " and ".join(wrong) + ".",
            hint="Set them in the settings the inbox's processes run with (see the 'Running "
            "at scale' how-to), or silence this check if the proxy keeps sessions "
            "(PgBouncer's session mode, a plain TCP proxy).",
            id="django_inbox.W012",
        )
    ]
