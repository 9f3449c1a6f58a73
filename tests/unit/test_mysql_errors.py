"""MySQL's and MariaDB's errors told apart by their codes: a connection that ended is not the
handler's failure (on MariaDB a killed connection used up the attempts of the messages it was
running: ``tests/system/test_consume.py::test_killed_database_connections_are_survived``), and
a refusal for the settings is not an outage. No database needed."""

from __future__ import annotations

import pytest
from django.db import utils

from django_inbox.db.connection import MYSQL_CONNECTION_ENDED, mysql_code
from django_inbox.db.outage import refused_for_settings


def wrapped(code: int, text: str) -> Exception:
    """As Django raises a driver's error: its own class, the driver's arguments, the cause."""
    try:
        try:
            raise OSError(code, text)  # stands for MySQLdb's error: same arguments
        except OSError as driver:
            raise utils.OperationalError(code, text) from driver
    except utils.OperationalError as exc:
        return exc


@pytest.mark.parametrize(
    "code", [2006, 2013, 1927, 1053, 1040], ids=["gone", "lost", "killed", "shutdown", "slots"]
)
def test_ended_connections_are_known_by_their_codes(code: int) -> None:
    assert mysql_code(wrapped(code, "…")) == code
    assert code in MYSQL_CONNECTION_ENDED


@pytest.mark.parametrize("code", [1213, 1205, 3024, 1062, 4025])
def test_a_deadlock_a_timeout_or_a_constraint_are_the_handlers(code: int) -> None:
    assert code not in MYSQL_CONNECTION_ENDED


def test_errors_without_a_code_have_none() -> None:
    assert mysql_code(ValueError("x")) is None
    assert mysql_code(utils.OperationalError("no code")) is None
    assert mysql_code(utils.OperationalError(True)) is None


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (1049, "Unknown database 'nope'"),
        (1045, "Access denied for user 'app'@'localhost' (using password: YES)"),
        (1044, "Access denied for user 'app'@'%' to database 'inbox'"),
    ],
)
def test_refusals_for_the_settings_are_not_outages(code: int, text: str) -> None:
    assert refused_for_settings(wrapped(code, text)) == text


def test_a_server_that_went_away_is_an_outage() -> None:
    assert refused_for_settings(wrapped(2006, "Server has gone away")) is None
