"""``django_inbox.checks``: each misconfiguration is reported by ``manage.py check``."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connection
from django.test import override_settings

from django_inbox.checks import check_database, check_handler_modules, check_settings
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


# --- E008 (INBOX_DATABASE only: safe to run through call_command) -----------------------------


def test_e008_unknown_database_alias() -> None:
    with override_settings(INBOX_DATABASE="inbox_db"):
        text = assert_check_fails("django_inbox.E008")
    assert "'inbox_db'" in text


# --- E009 / W002: DATABASES-related, checked by calling check_database() directly -------------


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


@pytest.mark.parametrize("engine", ["django.db.backends.postgresql", "django.db.backends.sqlite3"])
def test_supported_engines_pass(databases, engine: str) -> None:  # type: ignore[no-untyped-def]
    with databases(inbox={"ENGINE": engine}), override_settings(INBOX_DATABASE="inbox"):
        assert check_database() == []


def test_check_database_only_looks_at_the_inbox_alias(databases) -> None:  # type: ignore[no-untyped-def]
    with databases(other={"ENGINE": "django.db.backends.oracle", "AUTOCOMMIT": False}):
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
