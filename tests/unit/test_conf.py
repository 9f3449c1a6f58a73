"""``django_inbox.conf``: settings are read lazily, typed, and per-consumer policies apply."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.test import override_settings

from django_inbox.conf import DEFAULTS, POLICY_KEYS, Policy, inbox_settings

ALL_INBOX_SETTINGS = sorted(DEFAULTS)


@pytest.fixture
def bare_settings(settings):  # type: ignore[no-untyped-def]
    """Django settings with no ``INBOX_*`` name at all (the testproject sets INBOX_CONSUMERS).

    pytest-django's ``delattr`` sends no ``setting_changed`` for the name it deletes, so what
    ``inbox_settings`` read before (at an import, in an earlier test) is forgotten here: the
    defaults test failed when another module was collected first."""
    for name in ALL_INBOX_SETTINGS:
        if hasattr(settings, name):
            delattr(settings, name)
    inbox_settings.reload()
    yield settings
    inbox_settings.reload()


def test_testproject_leaves_global_policy_unset() -> None:
    # The assertions on defaults below rely on this.
    assert not hasattr(django_settings, "INBOX_MAX_ATTEMPTS")
    assert not hasattr(django_settings, "INBOX_LEASE")
    assert {"payments", "effects"} <= set(django_settings.INBOX_CONSUMERS)


def test_defaults_when_nothing_is_set(bare_settings) -> None:  # type: ignore[no-untyped-def]
    assert inbox_settings.max_attempts == 8
    assert inbox_settings.backoff_base == 2.0
    assert inbox_settings.backoff_max == 3600.0
    assert inbox_settings.lease == 300.0
    assert inbox_settings.retention == 30 * 86400.0
    assert inbox_settings.allow_replay_completed is True
    assert inbox_settings.consumers == {}
    assert inbox_settings.max_payload_bytes == 1024 * 1024
    assert inbox_settings.handlers_module == "inbox_handlers"
    assert inbox_settings.database == "default"
    assert inbox_settings.unhandled == "dead"
    assert inbox_settings.batch_size == 100
    assert inbox_settings.poll_interval == 1.0


def test_defaults_are_typed(bare_settings) -> None:  # type: ignore[no-untyped-def]
    assert type(inbox_settings.max_attempts) is int
    assert type(inbox_settings.max_payload_bytes) is int
    assert type(inbox_settings.batch_size) is int
    for name in ("backoff_base", "backoff_max", "lease", "retention", "poll_interval"):
        assert type(getattr(inbox_settings, name)) is float, name
    assert type(inbox_settings.allow_replay_completed) is bool


def test_reading_never_writes_defaults_into_settings(bare_settings) -> None:  # type: ignore[no-untyped-def]
    inbox_settings.max_attempts  # noqa: B018
    inbox_settings.policy("payments")
    inbox_settings.lease  # noqa: B018
    for name in ALL_INBOX_SETTINGS:
        assert not hasattr(django_settings, name), name


def test_override_settings_is_seen_at_access_time() -> None:
    assert inbox_settings.max_attempts == 8
    with override_settings(INBOX_MAX_ATTEMPTS=3):
        assert inbox_settings.max_attempts == 3
        with override_settings(INBOX_MAX_ATTEMPTS=5):
            assert inbox_settings.max_attempts == 5
        assert inbox_settings.max_attempts == 3
    assert inbox_settings.max_attempts == 8


@override_settings(
    INBOX_UNHANDLED="refuse",
    INBOX_DATABASE="other",
    INBOX_HANDLERS_MODULE="handlers",
    INBOX_MAX_PAYLOAD_BYTES=2048,
    INBOX_BATCH_SIZE=7,
    INBOX_ALLOW_REPLAY_COMPLETED=True,
)
def test_override_settings_decorator() -> None:
    assert inbox_settings.unhandled == "refuse"
    assert inbox_settings.database == "other"
    assert inbox_settings.handlers_module == "handlers"
    assert inbox_settings.max_payload_bytes == 2048
    assert inbox_settings.batch_size == 7
    assert inbox_settings.allow_replay_completed is True


@pytest.mark.parametrize(
    ("name", "attr", "value", "seconds"),
    [
        ("INBOX_LEASE", "lease", "5m", 300.0),
        ("INBOX_RETENTION", "retention", "30d", 2_592_000.0),
        ("INBOX_RETENTION", "retention", timedelta(days=7), 604_800.0),
        ("INBOX_BACKOFF_BASE", "backoff_base", "500ms", 0.5),
        ("INBOX_BACKOFF_MAX", "backoff_max", "2h", 7200.0),
        ("INBOX_BACKOFF_MAX", "backoff_max", 90, 90.0),
        ("INBOX_POLL_INTERVAL", "poll_interval", "250ms", 0.25),
        ("INBOX_BROKER_HEARTBEAT", "broker_heartbeat", "30s", 30.0),
        ("INBOX_BROKER_HEARTBEAT", "broker_heartbeat", None, 0.0),
        ("INBOX_RETENTION", "retention", "1w", 604_800.0),
    ],
)
def test_durations_may_be_strings_or_timedeltas(
    name: str, attr: str, value: object, seconds: float
) -> None:
    with override_settings(**{name: value}):
        assert getattr(inbox_settings, attr) == pytest.approx(seconds)


def test_bad_duration_raises_value_error_on_access_not_before() -> None:
    with override_settings(INBOX_LEASE="soon"):
        with pytest.raises(ValueError, match="duration"):
            inbox_settings.lease  # noqa: B018
        assert inbox_settings.max_attempts == 8  # other settings unaffected


def test_consumers_returns_a_copy() -> None:
    consumers = inbox_settings.consumers
    consumers["intruder"] = {}
    assert "intruder" not in inbox_settings.consumers
    assert "intruder" not in django_settings.INBOX_CONSUMERS


def test_consumers_none_is_empty() -> None:
    with override_settings(INBOX_CONSUMERS=None):
        assert inbox_settings.consumers == {}
        assert inbox_settings.policy("anyone").max_attempts == 8


@override_settings(
    INBOX_MAX_ATTEMPTS=5,
    INBOX_BACKOFF_BASE="3s",
    INBOX_BACKOFF_MAX="10m",
    INBOX_LEASE=120,
    INBOX_RETENTION="14d",
    INBOX_ALLOW_REPLAY_COMPLETED=False,
    INBOX_CONSUMERS={
        "inventory": {
            "max_attempts": 2,
            "lease": "10s",
            "allow_replay_completed": True,
            "commit_every": 50,
        },
        "payments": {"backoff_base": "500ms", "backoff_max": timedelta(minutes=1)},
        "empty": {},
    },
)
def test_consumer_policy_overrides_globals_key_by_key() -> None:
    assert inbox_settings.policy("inventory") == Policy(
        max_attempts=2,
        backoff_base=3.0,
        backoff_max=600.0,
        lease=10.0,
        retention=14 * 86400.0,
        allow_replay_completed=True,
        commit_every=50,
    )
    assert inbox_settings.policy("payments") == Policy(
        max_attempts=5,
        backoff_base=0.5,
        backoff_max=60.0,
        lease=120.0,
        retention=14 * 86400.0,
        allow_replay_completed=False,
        commit_every=1,
    )
    globals_only = Policy(
        max_attempts=5,
        backoff_base=3.0,
        backoff_max=600.0,
        lease=120.0,
        retention=14 * 86400.0,
        allow_replay_completed=False,
        commit_every=1,
    )
    assert inbox_settings.policy("empty") == globals_only
    assert inbox_settings.policy("not-configured") == globals_only


def test_policy_follows_override_settings() -> None:
    # The testproject's own consumer policy.
    assert inbox_settings.policy("payments").max_attempts == 4
    with override_settings(INBOX_CONSUMERS={"payments": {"max_attempts": 9}}):
        assert inbox_settings.policy("payments").max_attempts == 9
    assert inbox_settings.policy("payments").max_attempts == 4


def test_policy_keys_cover_the_policy_dataclass() -> None:
    assert set(POLICY_KEYS) == set(Policy.__dataclass_fields__)
    assert all(setting in DEFAULTS for setting in POLICY_KEYS.values())


# --- retention, dead retention, redelivery window, pending age, replay of completed rows ------


def test_defaults_of_the_retention_and_replay_settings(bare_settings) -> None:  # type: ignore[no-untyped-def]
    assert inbox_settings.dead_retention is None
    assert inbox_settings.redelivery_window == 7 * 86400.0
    assert inbox_settings.max_pending_age == 300.0
    assert inbox_settings.allow_replay_completed is True
    assert type(inbox_settings.redelivery_window) is float
    assert type(inbox_settings.max_pending_age) is float
    policy = inbox_settings.policy("x")
    assert policy.dead_retention is None
    assert policy.redelivery_window == 7 * 86400.0
    assert policy.allow_replay_completed is True
    assert policy.retention == 30 * 86400.0
    assert (
        DEFAULTS["INBOX_DEAD_RETENTION"],
        DEFAULTS["INBOX_REDELIVERY_WINDOW"],
        DEFAULTS["INBOX_MAX_PENDING_AGE"],
        DEFAULTS["INBOX_ALLOW_REPLAY_COMPLETED"],
    ) == (None, 7 * 86400.0, 300.0, True)
    # The Policy dataclass defaults agree with the settings' defaults.
    fields = Policy.__dataclass_fields__
    assert fields["dead_retention"].default is None
    assert fields["redelivery_window"].default == DEFAULTS["INBOX_REDELIVERY_WINDOW"]


def test_testproject_leaves_retention_settings_unset() -> None:
    for name in ("INBOX_RETENTION", "INBOX_DEAD_RETENTION", "INBOX_REDELIVERY_WINDOW"):
        assert not hasattr(django_settings, name), name
    assert inbox_settings.policy("effects").dead_retention is None
    assert inbox_settings.policy("effects").redelivery_window == 7 * 86400.0


@override_settings(
    INBOX_DEAD_RETENTION="30d",
    INBOX_REDELIVERY_WINDOW="2d",
    INBOX_MAX_PENDING_AGE="10m",
    INBOX_ALLOW_REPLAY_COMPLETED=False,
    INBOX_CONSUMERS={
        "x": {"dead_retention": "90d", "redelivery_window": timedelta(days=14)},
        "keeps": {"dead_retention": None, "allow_replay_completed": True},
        "window": {"redelivery_window": 0},
        "plain": {},
    },
)
def test_dead_retention_and_redelivery_window_per_consumer() -> None:
    assert inbox_settings.dead_retention == 30 * 86400.0
    assert inbox_settings.redelivery_window == 2 * 86400.0
    assert inbox_settings.max_pending_age == 600.0
    assert inbox_settings.allow_replay_completed is False

    x = inbox_settings.policy("x")
    assert (x.dead_retention, x.redelivery_window) == (90 * 86400.0, 14 * 86400.0)
    assert x.allow_replay_completed is False
    keeps = inbox_settings.policy("keeps")  # None overrides a global dead retention: keep
    assert (keeps.dead_retention, keeps.redelivery_window) == (None, 2 * 86400.0)
    assert keeps.allow_replay_completed is True
    window = inbox_settings.policy("window")
    assert (window.dead_retention, window.redelivery_window) == (30 * 86400.0, 0.0)
    for name in ("plain", "not-configured"):
        policy = inbox_settings.policy(name)
        assert (policy.dead_retention, policy.redelivery_window) == (30 * 86400.0, 2 * 86400.0)


@pytest.mark.parametrize(
    ("name", "attr", "value", "seconds"),
    [
        ("INBOX_DEAD_RETENTION", "dead_retention", "1w", 604_800.0),
        ("INBOX_DEAD_RETENTION", "dead_retention", timedelta(hours=1), 3600.0),
        ("INBOX_DEAD_RETENTION", "dead_retention", 0, 0.0),
        ("INBOX_REDELIVERY_WINDOW", "redelivery_window", "36h", 129_600.0),
        ("INBOX_MAX_PENDING_AGE", "max_pending_age", "500ms", 0.5),
        ("INBOX_MAX_PENDING_AGE", "max_pending_age", 90, 90.0),
    ],
)
def test_new_durations_may_be_strings_numbers_or_timedeltas(
    name: str, attr: str, value: object, seconds: float
) -> None:
    with override_settings(**{name: value}):
        assert getattr(inbox_settings, attr) == pytest.approx(seconds)
        assert type(getattr(inbox_settings, attr)) is float


@pytest.mark.parametrize(
    ("name", "attr"),
    [
        ("INBOX_DEAD_RETENTION", "dead_retention"),
        ("INBOX_REDELIVERY_WINDOW", "redelivery_window"),
        ("INBOX_MAX_PENDING_AGE", "max_pending_age"),
    ],
)
def test_bad_new_durations_raise_on_access(name: str, attr: str) -> None:
    with override_settings(**{name: "soon"}):
        with pytest.raises(ValueError, match="duration"):
            getattr(inbox_settings, attr)
        assert inbox_settings.retention == 30 * 86400.0  # other settings unaffected
