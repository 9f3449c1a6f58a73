"""Which database the suite runs on, for the tests that say what each one does."""

from __future__ import annotations

from django.db import connection


def on_mariadb() -> bool:
    """Whether the test database is MariaDB (Django's ``mysql`` engine serves MySQL too; asking
    which needs the server, so call it inside a test)."""
    return connection.vendor == "mysql" and bool(connection.mysql_is_mariadb)  # type: ignore[attr-defined]
