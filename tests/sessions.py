"""Ending other processes' database sessions from a test, as a server restart or an
operator's kill would."""

from __future__ import annotations

from typing import Any

from django.db import OperationalError

#: MariaDB's and MySQL's answer to ``KILL`` of a session that ended in between.
UNKNOWN_THREAD = 1094


def kill_sessions(connection: Any, application_name: str | None = None) -> int:
    """End the sessions of other processes on the test database, and return how many.

    On PostgreSQL, those whose ``application_name`` is ``application_name`` (every other one
    when ``None``); MariaDB and MySQL have no such name: every other session of the database.
    """
    with connection.cursor() as cursor:
        if connection.vendor != "mysql":
            named = "AND application_name = %s" if application_name else ""
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                f"current_database() AND pid <> pg_backend_pid() {named}",
                [application_name] if application_name else [],
            )
            return sum(1 for (ok,) in cursor.fetchall() if ok)
        cursor.execute(
            "SELECT ID FROM information_schema.PROCESSLIST "
            "WHERE DB = DATABASE() AND ID <> CONNECTION_ID()"
        )
        killed = 0
        for (session,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(session)}")
                killed += 1
            except OperationalError as exc:
                if exc.args[0] != UNKNOWN_THREAD:
                    raise
        return killed
