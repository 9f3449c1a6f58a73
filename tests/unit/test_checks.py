"""``django_inbox.checks``: each misconfiguration is reported by ``manage.py check``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings

from django_inbox.broker.checks import check_broker_settings
from django_inbox.checks import (
    check_database,
    check_handler_modules,
    check_settings,
    retry_horizon,
)
from django_inbox.registry import registry


def run_check(*args: str, **options: Any) -> str:
    out, err = StringIO(), StringIO()
    call_command("check", *args, stdout=out, stderr=err, **options)
    return out.getvalue() + err.getvalue()


def assert_check_fails(check_id: str, *, fail_level: str = "ERROR") -> str:
    with pytest.raises(SystemCheckError) as info:
        run_check(fail_level=fail_level)
    text = str(info.value)
    assert check_id in text, text
    return text


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


# --- the clean project -----------------------------------------------------------------------


def test_clean_project_passes_check() -> None:
    output = run_check(fail_level="WARNING")
    assert "django_inbox" not in output
    assert "no issues" in output


def test_clean_project_has_no_inbox_messages() -> None:
    assert check_handler_modules() == []
    assert check_settings() == []
    assert check_database() == []


# --- E001 ------------------------------------------------------------------------------------


@pytest.fixture
def import_error() -> Iterator[tuple[str, str]]:
    entry = (
        "shop.unit_broken_handlers",
        "Traceback (most recent call last):\n  ...\nNameError: name 'Stok' is not defined\n",
    )
    registry.import_errors.append(entry)
    try:
        yield entry
    finally:
        registry.import_errors.remove(entry)
    assert entry not in registry.import_errors


def test_e001_handler_module_import_error(import_error: tuple[str, str]) -> None:
    text = assert_check_fails("django_inbox.E001")
    assert "shop.unit_broken_handlers" in text
    assert "NameError: name 'Stok' is not defined" in text  # the hint: last traceback line
    [error] = check_handler_modules()
    assert error.id == "django_inbox.E001"
    assert error.obj == "shop.unit_broken_handlers"


# --- E002 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, "3", 2.5, True])
def test_e002_bad_max_attempts(value: object) -> None:
    with override_settings(INBOX_MAX_ATTEMPTS=value):
        text = assert_check_fails("django_inbox.E002")
    assert "INBOX_*" in text


@pytest.mark.parametrize(
    "overrides",
    [{"INBOX_MAX_ATTEMPTS": None}, {"INBOX_CONSUMERS": {"payments": {"max_attempts": None}}}],
)
def test_e002_max_attempts_none(overrides: dict[str, object]) -> None:
    with override_settings(**overrides):
        assert_check_fails("django_inbox.E002")


def test_e002_bad_consumer_max_attempts() -> None:
    with override_settings(INBOX_CONSUMERS={"payments": {"max_attempts": 0}}):
        text = assert_check_fails("django_inbox.E002")
    assert "INBOX_CONSUMERS['payments']" in text


# --- E003 ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"INBOX_BACKOFF_BASE": 0},
        {"INBOX_BACKOFF_BASE": "0s"},
        {"INBOX_BACKOFF_BASE": 10, "INBOX_BACKOFF_MAX": 5},
        {"INBOX_BACKOFF_BASE": "1m", "INBOX_BACKOFF_MAX": "30s"},
        {"INBOX_BACKOFF_BASE": "soon"},
        {"INBOX_BACKOFF_MAX": "forever"},
        {"INBOX_BACKOFF_BASE": -1},
        {"INBOX_RETENTION": "a month"},
        {"INBOX_LEASE": "5 minutes"},
    ],
)
def test_e003_bad_backoff(overrides: dict[str, object]) -> None:
    with override_settings(**overrides):
        assert_check_fails("django_inbox.E003")


@pytest.mark.parametrize(
    "policy",
    [
        {"backoff_base": 0},
        {"backoff_base": 5, "backoff_max": 1},
        {"backoff_max": "never"},
    ],
)
def test_e003_bad_consumer_backoff(policy: dict[str, object]) -> None:
    with override_settings(INBOX_CONSUMERS={"payments": policy}):
        text = assert_check_fails("django_inbox.E003")
    assert "INBOX_CONSUMERS['payments']" in text


def test_valid_durations_as_strings_pass() -> None:
    with override_settings(
        INBOX_BACKOFF_BASE="500ms", INBOX_BACKOFF_MAX="1h", INBOX_LEASE="5m", INBOX_RETENTION="30d"
    ):
        assert check_settings() == []


# --- E004 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, 0.5, "500ms", "999ms"])
def test_e004_lease_under_a_second(value: object) -> None:
    with override_settings(INBOX_LEASE=value):
        assert_check_fails("django_inbox.E004")


def test_e004_consumer_lease_under_a_second() -> None:
    with override_settings(INBOX_CONSUMERS={"effects": {"lease": "100ms"}}):
        text = assert_check_fails("django_inbox.E004")
    assert "INBOX_CONSUMERS['effects']" in text


def test_lease_of_one_second_passes() -> None:
    with override_settings(INBOX_LEASE="1s"):
        assert check_settings() == []


@pytest.mark.parametrize("value", [float("inf"), "99999999999999w"])
def test_lease_beyond_timedelta_range_is_reported(value: object) -> None:
    with override_settings(INBOX_LEASE=value):
        assert check_settings() != []


# --- E005 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [[("payments", {})], "payments", None])
def test_e005_consumers_not_a_dict(value: object) -> None:
    with override_settings(INBOX_CONSUMERS=value):
        text = assert_check_fails("django_inbox.E005")
    assert "INBOX_CONSUMERS must be a dict" in text


def test_e005_consumer_policy_not_a_dict() -> None:
    with override_settings(INBOX_CONSUMERS={"payments": 4}):
        text = assert_check_fails("django_inbox.E005")
    assert "INBOX_CONSUMERS['payments'] must be a dict" in text


def test_e005_unknown_policy_keys() -> None:
    with override_settings(INBOX_CONSUMERS={"payments": {"max_attempt": 3, "leese": "5m"}}):
        text = assert_check_fails("django_inbox.E005")
    assert "['leese', 'max_attempt']" in text
    assert "max_attempts" in text  # the hint lists the known keys


# --- E006 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["ignore", "DEAD", "", None, True])
def test_e006_bad_unhandled(value: object) -> None:
    with override_settings(INBOX_UNHANDLED=value):
        assert_check_fails("django_inbox.E006")


@pytest.mark.parametrize("value", ["dead", "refuse"])
def test_unhandled_choices_pass(value: str) -> None:
    with override_settings(INBOX_UNHANDLED=value):
        assert check_settings() == []


# --- E007 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["INBOX_MAX_PAYLOAD_BYTES", "INBOX_BATCH_SIZE"])
@pytest.mark.parametrize("value", [0, -1, "100", 1.5, True, None])
def test_e007_not_a_positive_int(name: str, value: object) -> None:
    with override_settings(**{name: value}):
        text = assert_check_fails("django_inbox.E007")
    assert name in text


# --- E010 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["INBOX_POLL_INTERVAL", "INBOX_BROKER_HEARTBEAT"])
@pytest.mark.parametrize("value", ["1 second", -1, float("nan")])
def test_e010_not_a_duration(name: str, value: object) -> None:
    with override_settings(**{name: value}):
        text = assert_check_fails("django_inbox.E010")
    assert name in text


@pytest.mark.parametrize("value", [0.5, "1500ms", 65_536, "1d"])
def test_e010_a_heartbeat_amqp_cannot_send(value: object) -> None:
    with override_settings(INBOX_BROKER_HEARTBEAT=value):
        text = assert_check_fails("django_inbox.E010")
    assert "whole seconds from 1 to 65,535" in text


@pytest.mark.parametrize("value", [0, None, 1, "30s", "2m", 65_535])
def test_heartbeats_amqp_can_send_pass(value: object) -> None:
    with override_settings(INBOX_BROKER_HEARTBEAT=value):
        assert ids(check_broker_settings()) == []


# --- E019 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 257, 10_000, "64", 1.5, True, None])
def test_e019_json_depth_out_of_range(value: object) -> None:
    with override_settings(INBOX_MAX_JSON_DEPTH=value):
        text = assert_check_fails("django_inbox.E019")
    assert "INBOX_MAX_JSON_DEPTH" in text


@pytest.mark.parametrize("value", [1, 64, 256])
def test_e019_json_depth_in_range(value: int) -> None:
    with override_settings(INBOX_MAX_JSON_DEPTH=value):
        assert [m.id for m in check_settings() if m.id == "django_inbox.E019"] == []


# --- E008 (INBOX_DATABASE only: safe to run through call_command) -----------------------------


def test_e008_unknown_database_alias() -> None:
    with override_settings(INBOX_DATABASE="inbox_db"):
        text = assert_check_fails("django_inbox.E008")
    assert "'inbox_db'" in text


# --- E009 / W002 / W004: DATABASES-related, checked by calling check_database() directly ----------


@pytest.fixture
def databases() -> Iterator[Any]:
    """Override DATABASES for check_database() only (no connection is opened)."""

    def override(**aliases: dict[str, Any]) -> Any:
        return override_settings(DATABASES={"default": dict(connection.settings_dict), **aliases})

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Overriding setting DATABASES")
        yield override


def test_e009_autocommit_false(databases) -> None:  # type: ignore[no-untyped-def]
    inbox = {**connection.settings_dict, "AUTOCOMMIT": False}
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        errors = check_database()
    assert ids(errors) == ["django_inbox.E009"]
    assert "AUTOCOMMIT" in errors[0].msg


def test_e009_myisam(databases) -> None:  # type: ignore[no-untyped-def]
    mysql = {
        "ENGINE": "django.db.backends.mysql",
        "OPTIONS": {"init_command": "SET default_storage_engine=MyISAM"},
    }
    with databases(inbox=mysql), override_settings(INBOX_DATABASE="inbox"):
        errors = check_database()
    assert "django_inbox.E009" in ids(errors)


def test_w002_unsupported_engine(databases) -> None:  # type: ignore[no-untyped-def]
    with (
        databases(inbox={"ENGINE": "django.db.backends.oracle"}),
        override_settings(INBOX_DATABASE="inbox"),
    ):
        errors = check_database()
    assert ids(errors) == ["django_inbox.W002"]
    assert "oracle" in errors[0].msg


def test_mariadb_and_mysql_pass_without_asking_the_server(databases) -> None:  # type: ignore[no-untyped-def]
    """Django's ``mysql`` engine serves MariaDB, which the suite proves; MySQL itself is told
    apart only by asking the server (``check --database``)."""
    with (
        databases(inbox={"ENGINE": "django.db.backends.mysql"}),
        override_settings(INBOX_DATABASE="inbox"),
    ):
        assert check_database() == []


@pytest.mark.django_db
def test_w002_asked_of_the_server_passes_mariadb_and_warns_mysql_itself() -> None:
    errors = [e for e in check_database(databases=["default"]) if e.id == "django_inbox.W002"]
    if connection.vendor != "mysql":
        assert errors == []
    elif connection.mysql_is_mariadb:
        assert errors == [], "MariaDB is proven by the suite"
    else:
        assert ids(errors) == ["django_inbox.W002"] and "MySQL" in errors[0].msg


@pytest.mark.parametrize(
    "level", ["repeatable read", "REPEATABLE READ", "serializable", "read uncommitted", None, ""]
)
def test_w007_mariadb_transactions_not_at_read_committed(databases, level: str | None) -> None:  # type: ignore[no-untyped-def]
    inbox = {"ENGINE": "django.db.backends.mysql", "OPTIONS": {"isolation_level": level}}
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        errors = check_database()
    assert ids(errors) == ["django_inbox.W007"]
    said = (level or "").upper() or "the server's default (REPEATABLE READ"
    assert said in errors[0].msg and "READ COMMITTED" in errors[0].msg
    assert "read committed" in (errors[0].hint or "")


@pytest.mark.parametrize(
    "options", [{}, {"isolation_level": "read committed"}, {"isolation_level": "READ COMMITTED"}]
)
def test_w007_read_committed_passes(databases, options: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    inbox = {"ENGINE": "django.db.backends.mysql", "OPTIONS": options}
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        assert check_database() == []


IMMEDIATE = {"OPTIONS": {"transaction_mode": "IMMEDIATE"}}


@pytest.mark.parametrize(
    "inbox",
    [
        {"ENGINE": "django.db.backends.postgresql"},
        {"ENGINE": "django.db.backends.sqlite3", **IMMEDIATE},
    ],
)
def test_supported_engines_pass(databases, inbox: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        assert check_database() == []


@pytest.mark.parametrize("options", [{}, {"transaction_mode": "DEFERRED"}, {"timeout": 30}])
def test_w006_sqlite_without_immediate_transactions(databases, options: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    inbox = {"ENGINE": "django.db.backends.sqlite3", "OPTIONS": options}
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        errors = check_database()
    assert ids(errors) == ["django_inbox.W006"]
    assert "database is locked" in errors[0].msg
    assert "IMMEDIATE" in (errors[0].hint or "")


def test_check_database_only_looks_at_the_inbox_alias(databases) -> None:  # type: ignore[no-untyped-def]
    with databases(other={"ENGINE": "django.db.backends.oracle", "AUTOCOMMIT": False}):
        assert check_database() == []


@pytest.mark.parametrize("max_age", [1, 30, 59.5])
def test_w004_a_short_conn_max_age_makes_workers_reconnect(databases, max_age: float) -> None:  # type: ignore[no-untyped-def]
    inbox = {"ENGINE": "django.db.backends.postgresql", "CONN_MAX_AGE": max_age}
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        errors = check_database()
    assert ids(errors) == ["django_inbox.W004"]
    assert f"reconnect every {max_age!r} seconds" in errors[0].msg
    assert "CONN_MAX_AGE = 0" in (errors[0].hint or "")


@pytest.mark.parametrize("max_age", [0, None, 60, 600, True, "30"])
def test_w004_not_for_ages_that_keep_the_connection(databases, max_age: Any) -> None:  # type: ignore[no-untyped-def]
    inbox = {"ENGINE": "django.db.backends.postgresql", "CONN_MAX_AGE": max_age}
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        assert check_database() == []


def test_w004_only_on_postgresql(databases) -> None:  # type: ignore[no-untyped-def]
    inbox = {"ENGINE": "django.db.backends.sqlite3", "CONN_MAX_AGE": 10, **IMMEDIATE}
    with databases(inbox=inbox), override_settings(INBOX_DATABASE="inbox"):
        assert check_database() == []


def test_e008_direct() -> None:
    with override_settings(INBOX_DATABASE="missing"):
        assert ids(check_database()) == ["django_inbox.E008"]


# --- W001 ------------------------------------------------------------------------------------


def test_w001_consumer_without_handlers() -> None:
    consumers = {"paymnets": {"max_attempts": 3}, "payments": {"max_attempts": 3}}
    with override_settings(INBOX_CONSUMERS=consumers):
        # A warning alone does not fail `check`...
        output = run_check()
        assert "django_inbox.W001" in output
        assert "'paymnets'" in output
        # ...but does with --fail-level WARNING.
        assert_check_fails("django_inbox.W001", fail_level="WARNING")
        [warning] = check_settings()
    assert warning.id == "django_inbox.W001"
    assert "'paymnets'" in warning.msg
    assert "payments" in warning.hint  # the consumers that do have handlers


def test_w001_not_raised_for_consumers_with_handlers() -> None:
    with override_settings(INBOX_CONSUMERS={"inventory": {}, "audit": {"max_attempts": 2}}):
        assert check_settings() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"INBOX_BROKER_URL": "localhost:5672"},
        {"INBOX_BROKER_URL": 5672},
        {"INBOX_BROKER_TRANSPORT_OPTIONS": [("visibility_timeout", 5)]},
    ],
)
def test_e012_broker_settings(overrides: dict[str, object]) -> None:
    with override_settings(**overrides):
        assert_check_fails("django_inbox.E012")


def test_e007_prefetch_must_be_positive() -> None:
    with override_settings(INBOX_PREFETCH=0):
        assert_check_fails("django_inbox.E007")


@pytest.mark.parametrize(
    ("name", "value"), [("INBOX_PREFETCH", 65_536), ("INBOX_BATCH_SIZE", 100_001)]
)
def test_e007_batch_size_and_prefetch_have_a_ceiling(name: str, value: int) -> None:
    with override_settings(**{name: value}):
        assert "must be at most" in assert_check_fails("django_inbox.E007")


# --- W003: retention shorter than the window in which a duplicate can still arrive ----------

DAY = 86400.0


def w003(messages: list[Any]) -> list[Any]:
    return [m for m in messages if m.id == "django_inbox.W003"]


def consumers_with(**policies: dict[str, Any]) -> dict[str, Any]:
    """The testproject's INBOX_CONSUMERS with some consumers' policies extended."""
    from django.conf import settings

    consumers = {name: dict(policy) for name, policy in settings.INBOX_CONSUMERS.items()}
    for name, extra in policies.items():
        consumers[name] = {**consumers.get(name, {}), **extra}
    return consumers


def test_w003_global_retention_shorter_than_redelivery_window_plus_retries() -> None:
    horizon = 7 * DAY + retry_horizon("")  # INBOX_REDELIVERY_WINDOW + the global schedule
    assert horizon > 7 * DAY

    with override_settings(INBOX_RETENTION=horizon - 1):
        messages = check_settings()
        output = run_check()
        assert_check_fails("django_inbox.W003", fail_level="WARNING")

    # One warning: every consumer inherits the global retention, none is warned about again.
    assert ids(messages) == ["django_inbox.W003"]
    [warning] = messages
    assert warning.obj == "INBOX_RETENTION"
    assert "INBOX_RETENTION" in warning.msg and "INBOX_REDELIVERY_WINDOW" in warning.msg
    assert "processed again" in warning.msg
    assert "django_inbox.W003" in output
    with override_settings(INBOX_RETENTION=horizon):
        assert check_settings() == []


@pytest.mark.parametrize(
    "overrides",
    [
        {"INBOX_RETENTION": "7d"},
        {"INBOX_RETENTION": "1d", "INBOX_REDELIVERY_WINDOW": 23.5 * 3600},  # + 44 min retries
        {"INBOX_REDELIVERY_WINDOW": "30d"},  # as long as the default retention
        {"INBOX_RETENTION": "8d", "INBOX_MAX_ATTEMPTS": 50},  # 50 attempts: 1.8 days
        {"INBOX_RETENTION": "8d", "INBOX_LEASE": "1d"},  # 8 attempts of up to a day each
    ],
)
def test_w003_global(overrides: dict[str, object]) -> None:
    with override_settings(**overrides):
        assert [m.obj for m in check_settings()] == ["INBOX_RETENTION"]


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"INBOX_RETENTION": "8d"},
        {"INBOX_RETENTION": "1d", "INBOX_REDELIVERY_WINDOW": "1h"},
        {"INBOX_RETENTION": "60d", "INBOX_REDELIVERY_WINDOW": "30d"},
        {"INBOX_RETENTION": "1h", "INBOX_REDELIVERY_WINDOW": 0, "INBOX_MAX_ATTEMPTS": 1},
    ],
)
def test_no_w003_when_retention_outlasts_the_duplicates(overrides: dict[str, object]) -> None:
    with override_settings(**overrides):
        assert check_settings() == []


def test_w003_consumer_retention_names_the_consumer() -> None:
    with override_settings(INBOX_CONSUMERS=consumers_with(effects={"retention": "1d"})):
        messages = check_settings()
    assert ids(messages) == ["django_inbox.W003"]
    [warning] = messages
    assert warning.obj == "effects"
    assert "consumer 'effects': retention (1.0 days)" in warning.msg


def test_w003_consumer_redelivery_window_longer_than_its_retention() -> None:
    policy = {"redelivery_window": "60d"}
    with override_settings(INBOX_CONSUMERS=consumers_with(stream=policy)):
        assert [m.obj for m in check_settings()] == ["stream"]
    with override_settings(INBOX_CONSUMERS=consumers_with(stream={**policy, "retention": "61d"})):
        assert check_settings() == []


def test_w003_not_for_a_consumer_whose_own_retention_is_long_enough() -> None:
    consumers = consumers_with(effects={"retention": "30d"})
    with override_settings(INBOX_RETENTION="1d", INBOX_CONSUMERS=consumers):
        assert [m.obj for m in check_settings()] == ["INBOX_RETENTION"]


def test_w003_once_globally_and_once_per_consumer_with_its_own_retention() -> None:
    consumers = consumers_with(effects={"retention": "2d"}, stream={"retention": "3d"})
    with override_settings(INBOX_RETENTION="1d", INBOX_CONSUMERS=consumers):
        messages = check_settings()
    # inventory, payments and audit inherit the global retention: no warning of their own.
    assert ids(messages) == ["django_inbox.W003"] * 3
    assert [m.obj for m in messages] == ["INBOX_RETENTION", "effects", "stream"]
    assert len({m.msg for m in messages}) == 3


def test_w003_for_a_consumer_inheriting_the_retention_but_retrying_for_weeks() -> None:
    # "stream" keeps the global 30 days, but its own schedule retries for over 30 days; it is
    # warned about even though another consumer ("effects") was warned about first.
    consumers = consumers_with(
        effects={"retention": "1d"}, stream={"max_attempts": 40, "backoff_max": "2d"}
    )
    with override_settings(INBOX_CONSUMERS=consumers):
        assert 7 * DAY + retry_horizon("stream") > 30 * DAY
        messages = check_settings()
    assert [m.obj for m in messages] == ["effects", "stream"]
    assert "consumer 'stream': retention (30.0 days)" in messages[1].msg


def test_w003_is_not_hidden_by_another_warning() -> None:
    consumers = consumers_with(paymnets={"max_attempts": 3})  # W001: a typo
    with override_settings(INBOX_RETENTION="1d", INBOX_CONSUMERS=consumers):
        assert sorted(ids(check_settings())) == ["django_inbox.W001", "django_inbox.W003"]


def test_w003_not_computed_from_invalid_settings() -> None:
    with override_settings(INBOX_RETENTION="a month"):
        assert ids(check_settings()) == ["django_inbox.E003"]
    with override_settings(INBOX_REDELIVERY_WINDOW="soon", INBOX_RETENTION="1s"):
        assert ids(check_settings()) == ["django_inbox.E003"]


# --- E003 / E014: dead retention, redelivery window, max pending age --------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("INBOX_DEAD_RETENTION", "forever"),
        ("INBOX_DEAD_RETENTION", -1),
        ("INBOX_DEAD_RETENTION", "1 month"),
        ("INBOX_DEAD_RETENTION", True),
        ("INBOX_REDELIVERY_WINDOW", "a week"),
        ("INBOX_REDELIVERY_WINDOW", -5),
        ("INBOX_REDELIVERY_WINDOW", None),
    ],
)
def test_e003_bad_dead_retention_or_redelivery_window(name: str, value: object) -> None:
    with override_settings(**{name: value}):
        text = assert_check_fails("django_inbox.E003")
        assert ids(check_settings()) == ["django_inbox.E003"]
    assert name.removeprefix("INBOX_").lower() in text


@pytest.mark.parametrize(
    "policy",
    [{"dead_retention": "soon"}, {"dead_retention": -3}, {"redelivery_window": "later"}],
)
def test_e003_bad_consumer_dead_retention_or_redelivery_window(policy: dict[str, object]) -> None:
    with override_settings(INBOX_CONSUMERS=consumers_with(effects=policy)):
        text = assert_check_fails("django_inbox.E003")
    assert "INBOX_CONSUMERS['effects']" in text
    assert next(iter(policy)) in text


@pytest.mark.parametrize(
    "overrides",
    [
        {"INBOX_DEAD_RETENTION": None},
        {"INBOX_DEAD_RETENTION": "90d"},
        {"INBOX_DEAD_RETENTION": timedelta(days=1)},
        {"INBOX_REDELIVERY_WINDOW": "1d"},
        {"INBOX_MAX_PENDING_AGE": "10m"},
        {"INBOX_CONSUMERS": {"effects": {"dead_retention": None, "redelivery_window": "1h"}}},
    ],
)
def test_valid_dead_retention_redelivery_window_and_pending_age_pass(
    overrides: dict[str, object],
) -> None:
    with override_settings(**overrides):
        assert check_settings() == []


@pytest.mark.parametrize("value", ["soon", -1, None, True, "5 minutes"])
def test_e014_bad_max_pending_age(value: object) -> None:
    with override_settings(INBOX_MAX_PENDING_AGE=value):
        text = assert_check_fails("django_inbox.E014")
        assert ids(check_settings()) == ["django_inbox.E014"]
    assert "INBOX_MAX_PENDING_AGE" in text
