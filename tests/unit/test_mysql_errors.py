"""MySQL's and MariaDB's errors told apart by their codes, as ``mysqlclient`` raises them and
Django wraps them: a connection that ended is not the handler's failure (on MariaDB a killed
connection used up the attempts of the messages it was running:
``tests/system/test_consume.py::test_killed_database_connections_are_survived`` proves the
whole path there), a deadlock or a timeout is, and a refusal for the settings is not an
outage. No database needed: the connection is told it is MySQL's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, utils

from django_inbox.db.connection import conflicted, connection_lost, mysql_error
from django_inbox.db.outage import refused_for_settings

MySQLdb = pytest.importorskip("MySQLdb", reason="mysqlclient (the dev extra) raises these")


def raised(kind: str, code: int, text: str) -> Exception:
    """``mysqlclient``'s error, re-raised by Django as its own class with the same arguments."""
    try:
        try:
            raise getattr(MySQLdb, kind)(code, text)
        except MySQLdb.Error as driver:
            raise getattr(utils, kind)(code, text) from driver
    except utils.Error as exc:
        return exc


@pytest.fixture
def on_mysql(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``connection_lost()`` reads the codes on MySQL and MariaDB only."""
    monkeypatch.setattr(connection, "vendor", "mysql")
    yield


ENDED = [
    (2006, "Server has gone away"),
    (2013, "Lost connection to server during query"),
    (1927, "Connection was killed"),
    (1053, "Server shutdown in progress"),
    (1040, "Too many connections"),
    (2003, "Can't connect to server on '127.0.0.1' (111)"),
    # out of disk or memory: infrastructure, waited for like an outage
    (1114, "The table 'effects_effect' is full"),
    (1021, "Disk full (/var/tmp/#sql_1.MAI); waiting for someone to free some space..."),
    (1041, "Out of memory; check if mysqld or some other process uses all available memory"),
]


@pytest.mark.parametrize(("code", "text"), ENDED, ids=[str(code) for code, _ in ENDED])
def test_a_connection_that_ended_is_not_the_handlers_failure(
    on_mysql: None, code: int, text: str
) -> None:
    assert connection_lost(raised("OperationalError", code, text), "default") is True


HANDLERS = [
    ("OperationalError", 1213, "Deadlock found when trying to get lock"),
    ("OperationalError", 1205, "Lock wait timeout exceeded; try restarting transaction"),
    ("OperationalError", 1969, "Query execution was interrupted (max_statement_time exceeded)"),
    ("IntegrityError", 1062, "Duplicate entry 'x' for key 'user_version'"),
    ("IntegrityError", 4025, "CONSTRAINT `payload` failed"),
    # MySQL's session ended for idling in its transaction: the handler's, as on PostgreSQL
    ("OperationalError", 4031, "The client was disconnected by the server because of inactivity."),
]


@pytest.mark.parametrize(("kind", "code", "text"), HANDLERS, ids=[str(h[1]) for h in HANDLERS])
def test_deadlocks_timeouts_and_refusals_are_the_handlers(
    on_mysql: None, kind: str, code: int, text: str
) -> None:
    assert connection_lost(raised(kind, code, text), "default") is False


def test_errors_without_a_code_have_none() -> None:
    assert mysql_error(ValueError("x")) is None
    assert mysql_error(utils.OperationalError("no code")) is None
    assert mysql_error(utils.OperationalError(True)) is None


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (1049, "Unknown database 'nope'"),
        (1045, "Access denied for user 'app'@'localhost' (using password: YES)"),
        (1044, "Access denied for user 'app'@'%' to database 'inbox'"),
    ],
)
def test_refusals_for_the_settings_are_not_outages(code: int, text: str) -> None:
    assert refused_for_settings(raised("OperationalError", code, text)) == text


def test_a_server_that_went_away_is_an_outage() -> None:
    assert refused_for_settings(raised("OperationalError", 2006, "Server has gone away")) is None


@pytest.mark.parametrize(
    ("code", "conflict"), [(1213, True), (1205, True), (2013, False), (1062, False)]
)
def test_deadlocks_and_lock_timeouts_are_conflicts(code: int, conflict: bool) -> None:
    """What a worker tries again when its own statement meets it (test_worker_conflicts.py)."""
    assert conflicted(raised("OperationalError", code, "…")) is conflict
