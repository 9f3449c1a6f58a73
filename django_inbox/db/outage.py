"""A long-running process's database being away: wait for it with backoff (:class:`Outage`),
and tell an outage from a database that refuses the connection for its settings.

A database that restarts, refuses connections (nothing listens), is starting up or has no free
slot is an outage: ``inbox_process`` and ``inbox_consume`` wait for it, however long it takes.
One that refuses the connection for its settings (no such database or role, a wrong password,
no ``pg_hba.conf`` entry) is a configuration error: waiting cannot mend it, so they end with
:class:`DatabaseMisconfigured` (exit 2) instead of retrying for ever
(:func:`refused_for_settings`).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from ..processing.retry import Backoff
from .connection import (
    describe,
    drop_connection,
    lost_prepared_statement,
    mysql_error,
    sqlstate,
)

logger = logging.getLogger("django_inbox")

#: SQLSTATEs of a connection refused for its settings: no such database (3D000), no such role
#: or no ``pg_hba.conf`` entry (28000), a wrong password (28P01).
REFUSED_STATES = ("3D000", "28000", "28P01")
#: MySQL's and MariaDB's: no such database (1049), access denied to a database (1044) or for
#: a user and password (1045, 1698).
REFUSED_CODES = frozenset({1044, 1045, 1049, 1698})
#: The same refusals in the words of the server (in English: ``lc_messages``) and of libpq, for
#: a failed connect, which psycopg reports without an SQLSTATE.
REFUSED_WORDS = re.compile(
    r'(database|role) ".*" does not exist|password authentication failed|'
    r"authentication failed for user|no pg_hba\.conf entry|no password supplied"
)


class DatabaseMisconfigured(Exception):
    """The database refused the connection for its settings (no such database or role, a
    wrong password): a configuration error, which waiting cannot mend."""


def refused_for_settings(exc: BaseException) -> str | None:
    """If ``exc`` is the database refusing a connection for its settings (no such database or
    role, a wrong password, no ``pg_hba.conf`` entry): what the server said, in one line;
    otherwise ``None``. A refused connect (nothing listens), a server starting up or shutting
    down, no free slot are not: they are outages, waited for.

    Recognised by SQLSTATE where the driver gives one, else by the server's English words: a
    server whose ``lc_messages`` is another language makes such a refusal look like an outage
    (waited for, as before).
    """
    state = sqlstate(exc)
    text = str(exc).strip()
    found = mysql_error(exc)
    if found is not None and found[0] in REFUSED_CODES:
        return found[1][:300]
    if state in REFUSED_STATES or (state is None and REFUSED_WORDS.search(text)):
        said = text.split("FATAL:", 1)[-1].strip().splitlines()
        return said[0][:300] if said else type(exc).__name__
    return None


def misconfigured(exc: BaseException, using: str) -> DatabaseMisconfigured:
    """The error that ends a long-running command for a refusal of ``refused_for_settings``."""
    said = refused_for_settings(exc)
    return DatabaseMisconfigured(
        f"the inbox's database {using!r} refused the connection: {said}. This is a "
        "configuration error, not an outage: check DATABASES (or DATABASE_URL)"
    )


class Outage:
    """A long-running process's view of its database being away: log once when it goes and
    once when it is back, drop the broken connection, and wait with backoff in between.

    Args:
        using: the inbox's database alias.
        name: who is waiting, for the log lines (``inbox_process``, ``inbox_consume x``).
        wait: sleeps for the given seconds, returning early (True) on a stop request.
    """

    def __init__(self, using: str, name: str, wait: Callable[[float], object]) -> None:
        self.using, self.name, self._wait = using, name, wait
        self.backoff = Backoff()
        self.since: float | None = None

    def wait(self, exc: BaseException) -> None:
        """The database was lost (``exc``): drop the connection, wait before the next try.

        A transaction lost to a prepared statement the server no longer knows is no outage:
        the connection is healthy and the inbox has stopped preparing, so the work is tried
        again at once. A database that refuses the connection for its settings is no outage
        either: :class:`DatabaseMisconfigured` is raised, for the command to exit 2."""
        if refused_for_settings(exc):
            raise misconfigured(exc, self.using) from None
        if lost_prepared_statement(exc):
            logger.warning(
                "%s: a transaction was lost with a prepared statement (%s); trying again "
                "unprepared",
                self.name,
                describe(exc),
            )
            return
        delay = self.backoff.next()
        if self.since is None:
            self.since = time.monotonic()
            logger.error(
                "%s: lost the database connection (%s); reconnecting with backoff",
                self.name,
                describe(exc),
            )
        else:
            logger.warning(
                "%s: database still unreachable (%s); next try in %.1fs",
                self.name,
                describe(exc),
                delay,
            )
        drop_connection(self.using)
        self._wait(delay)

    def over(self) -> None:
        """A unit of work succeeded: if the database had been away, say it is back."""
        if self.since is not None:
            logger.warning(
                "%s: database reachable again after %.1fs", self.name, time.monotonic() - self.since
            )
            self.since = None
            self.backoff.reset()
