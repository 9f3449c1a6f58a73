"""``db/outage.py``: what a failed connect is. A refusal for the settings (no such database or
role) ends a long-running command; nothing listening is an outage, waited for. Real connects
to the real server, no mock (the commands' exits are in ``tests/system/test_guardrails.py``)."""

from __future__ import annotations

import socket

import psycopg
import pytest
from django.db import DatabaseError, connection

from django_inbox.db.outage import misconfigured, refused_for_settings

pytestmark = pytest.mark.postgres


def connect_error(**changes: object) -> BaseException:
    settings = connection.settings_dict
    params = {
        "host": settings.get("HOST") or "127.0.0.1",
        "port": settings.get("PORT") or 5432,
        "user": settings.get("USER") or "postgres",
        "dbname": "postgres",
        "connect_timeout": 10,
        **changes,
    }
    try:
        psycopg.connect(**params).close()  # type: ignore[arg-type]
    except psycopg.OperationalError as exc:
        return exc
    raise AssertionError(f"connected with {changes}")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_no_such_database_or_role_is_refused_for_the_settings() -> None:
    database = connect_error(dbname="inbox_no_such_database")
    role = connect_error(user="inbox_no_such_role")

    assert refused_for_settings(database) == 'database "inbox_no_such_database" does not exist'
    assert refused_for_settings(role) == 'role "inbox_no_such_role" does not exist'
    said = str(misconfigured(database, "default"))
    assert said.startswith("the inbox's database 'default' refused the connection: database")
    assert "configuration error, not an outage" in said


def test_nothing_listening_is_an_outage() -> None:
    assert refused_for_settings(connect_error(port=free_port())) is None


@pytest.mark.django_db
def test_an_error_of_a_connected_session_is_not_a_refusal() -> None:
    """A handler's query naming a missing role has an SQLSTATE (42704): not a connect."""
    with pytest.raises(DatabaseError) as info, connection.cursor() as cursor:
        cursor.execute('SET ROLE "inbox_no_such_role"')
    assert 'role "inbox_no_such_role" does not exist' in str(info.value)
    assert refused_for_settings(info.value) is None
