"""Lazy, typed access to the ``INBOX_*`` settings and per-consumer policies.

Nothing here reads :mod:`django.conf.settings` at import time, and no default is ever written
into it: each attribute of :data:`inbox_settings` looks the setting up when it is read, so
``override_settings`` in tests and late configuration both work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed

from .durations import to_seconds

DEFAULTS: dict[str, Any] = {
    "INBOX_MAX_ATTEMPTS": 8,
    "INBOX_BACKOFF_BASE": 2.0,
    "INBOX_BACKOFF_MAX": 3600.0,
    "INBOX_LEASE": 300.0,
    "INBOX_RETENTION": 30 * 86400.0,
    "INBOX_DEAD_RETENTION": None,
    # How long a purged completed message's tombstone is kept (from the purge): a copy that
    # arrives meanwhile is parked, not run again. ``None``: purge keeps no tombstones.
    "INBOX_TOMBSTONE_RETENTION": 30 * 86400.0,
    "INBOX_REDELIVERY_WINDOW": 7 * 86400.0,
    "INBOX_MAX_PENDING_AGE": 300.0,
    "INBOX_ALLOW_REPLAY_COMPLETED": True,
    "INBOX_COMMIT_EVERY": 1,
    "INBOX_CONSUMERS": {},
    "INBOX_MAX_PAYLOAD_BYTES": 1024 * 1024,
    "INBOX_MAX_JSON_DEPTH": 64,
    "INBOX_HANDLERS_MODULE": "inbox_handlers",
    # Where @inbox_task functions live: imported when Celery is installed, so that workers
    # without Celery (inbox_process) find the handlers of task rows.
    "INBOX_TASK_MODULES": ("tasks",),
    "INBOX_DATABASE": "default",
    "INBOX_UNHANDLED": "dead",
    "INBOX_BATCH_SIZE": 100,
    "INBOX_BROKER_URL": None,
    "INBOX_BROKER_TRANSPORT_OPTIONS": {},
    "INBOX_PREFETCH": 100,
    "INBOX_BROKER_HEARTBEAT": 0,
    "INBOX_ENVELOPE": "django_inbox.broker.envelope.parse",
    "INBOX_POLL_INTERVAL": 1.0,
    "INBOX_ADMIN": True,
    "INBOX_METRICS": False,
    "INBOX_PREPARED_STATEMENTS": True,
    "INBOX_ORDERED": False,
    "INBOX_GAP_TIMEOUT": 600.0,
    "INBOX_FIRST_SEQUENCE": 1,
    "INBOX_SIDE_EFFECTS_ON_RERUN": "run",
    # The outbox companion (django_inbox.outbox).
    "INBOX_OUTBOX_MAX_ATTEMPTS": 10,
    "INBOX_OUTBOX_BACKOFF_BASE": 1.0,
    "INBOX_OUTBOX_BACKOFF_MAX": 300.0,
    "INBOX_OUTBOX_LEASE": 60.0,
    "INBOX_OUTBOX_CONFIRM_TIMEOUT": 10.0,
    "INBOX_OUTBOX_RETENTION": 7 * 86400.0,
}

#: Keys a consumer may override in ``INBOX_CONSUMERS`` and the global setting each one defaults to.
POLICY_KEYS: dict[str, str] = {
    "max_attempts": "INBOX_MAX_ATTEMPTS",
    "backoff_base": "INBOX_BACKOFF_BASE",
    "backoff_max": "INBOX_BACKOFF_MAX",
    "lease": "INBOX_LEASE",
    "retention": "INBOX_RETENTION",
    "dead_retention": "INBOX_DEAD_RETENTION",
    "tombstone_retention": "INBOX_TOMBSTONE_RETENTION",
    "redelivery_window": "INBOX_REDELIVERY_WINDOW",
    "allow_replay_completed": "INBOX_ALLOW_REPLAY_COMPLETED",
    "commit_every": "INBOX_COMMIT_EVERY",
    "ordered": "INBOX_ORDERED",
    "gap_timeout": "INBOX_GAP_TIMEOUT",
    "first_sequence": "INBOX_FIRST_SEQUENCE",
    "side_effects_on_rerun": "INBOX_SIDE_EFFECTS_ON_RERUN",
}

UNHANDLED_CHOICES = ("dead", "refuse")
#: What a ``@side_effect`` call does during a re-run of a completed message.
SIDE_EFFECTS_CHOICES = ("run", "suppress")


@dataclass(frozen=True)
class Policy:
    """How one consumer's messages are retried, leased and kept. Durations are seconds."""

    max_attempts: int
    backoff_base: float
    backoff_max: float
    lease: float
    retention: float
    allow_replay_completed: bool
    commit_every: int
    #: How long ``dead`` rows are kept; ``None``: until an operator replays or purges them.
    dead_retention: float | None = None
    #: How long a purged completed message's tombstone is kept; ``None``: none is kept.
    tombstone_retention: float | None = 30 * 86400.0
    #: How long after processing a duplicate may still arrive (broker, producer, replays).
    redelivery_window: float = 7 * 86400.0
    #: Messages with a key run one at a time per key, in ascending ``sequence``.
    ordered: bool = False
    #: How long a message waits for a missing sequence before it is parked.
    gap_timeout: float = 600.0
    #: The sequence a key's first message has.
    first_sequence: int = 1
    #: ``"run"`` or ``"suppress"``: ``@side_effect`` calls during a re-run of a completed message.
    side_effects_on_rerun: str = "run"

    @property
    def suppresses_side_effects(self) -> bool:
        """Whether ``@side_effect`` calls are skipped while a completed message re-runs."""
        return self.side_effects_on_rerun == "suppress"


class InboxSettings:
    """Typed view of the ``INBOX_*`` settings, resolved when first read.

    Values are looked up in :mod:`django.conf.settings` on first use (never at import) and
    remembered; ``override_settings`` and other ``setting_changed`` senders clear the memory.
    """

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def _get(self, name: str) -> Any:
        try:
            return self._cache[name]
        except KeyError:
            value = self._cache[name] = getattr(settings, name, DEFAULTS[name])
            return value

    def reload(self) -> None:
        """Forget what was read, so the next access sees the settings as they are now."""
        self._cache.clear()

    @property
    def max_attempts(self) -> int:
        return int(self._get("INBOX_MAX_ATTEMPTS"))

    @property
    def backoff_base(self) -> float:
        return to_seconds(self._get("INBOX_BACKOFF_BASE"))

    @property
    def backoff_max(self) -> float:
        return to_seconds(self._get("INBOX_BACKOFF_MAX"))

    @property
    def lease(self) -> float:
        return to_seconds(self._get("INBOX_LEASE"))

    @property
    def retention(self) -> float:
        return to_seconds(self._get("INBOX_RETENTION"))

    @property
    def dead_retention(self) -> float | None:
        value = self._get("INBOX_DEAD_RETENTION")
        return None if value is None else to_seconds(value)

    @property
    def tombstone_retention(self) -> float | None:
        value = self._get("INBOX_TOMBSTONE_RETENTION")
        return None if value is None else to_seconds(value)

    @property
    def redelivery_window(self) -> float:
        return to_seconds(self._get("INBOX_REDELIVERY_WINDOW"))

    @property
    def max_pending_age(self) -> float:
        return to_seconds(self._get("INBOX_MAX_PENDING_AGE"))

    @property
    def allow_replay_completed(self) -> bool:
        return bool(self._get("INBOX_ALLOW_REPLAY_COMPLETED"))

    @property
    def commit_every(self) -> int:
        return int(self._get("INBOX_COMMIT_EVERY"))

    @property
    def consumers(self) -> dict[str, dict[str, Any]]:
        return dict(self._get("INBOX_CONSUMERS") or {})

    @property
    def max_payload_bytes(self) -> int:
        return int(self._get("INBOX_MAX_PAYLOAD_BYTES"))

    @property
    def max_json_depth(self) -> int:
        return int(self._get("INBOX_MAX_JSON_DEPTH"))

    @property
    def handlers_module(self) -> str:
        return str(self._get("INBOX_HANDLERS_MODULE"))

    @property
    def task_modules(self) -> tuple[str, ...]:
        value = self._get("INBOX_TASK_MODULES")
        return (value,) if isinstance(value, str) else tuple(value or ())

    @property
    def database(self) -> str:
        return str(self._get("INBOX_DATABASE"))

    @property
    def unhandled(self) -> str:
        return str(self._get("INBOX_UNHANDLED"))

    @property
    def batch_size(self) -> int:
        return int(self._get("INBOX_BATCH_SIZE"))

    @property
    def broker_url(self) -> str | None:
        value = self._get("INBOX_BROKER_URL")
        return None if value is None else str(value)

    @property
    def broker_transport_options(self) -> dict[str, Any]:
        return dict(self._get("INBOX_BROKER_TRANSPORT_OPTIONS") or {})

    @property
    def envelope(self) -> str:
        return str(self._get("INBOX_ENVELOPE"))

    @property
    def prefetch(self) -> int:
        return int(self._get("INBOX_PREFETCH"))

    @property
    def broker_heartbeat(self) -> float:
        return to_seconds(self._get("INBOX_BROKER_HEARTBEAT") or 0)

    @property
    def poll_interval(self) -> float:
        return to_seconds(self._get("INBOX_POLL_INTERVAL"))

    @property
    def admin(self) -> bool:
        return bool(self._get("INBOX_ADMIN"))

    @property
    def metrics(self) -> bool:
        return bool(self._get("INBOX_METRICS"))

    @property
    def prepared_statements(self) -> bool:
        return bool(self._get("INBOX_PREPARED_STATEMENTS"))

    def policy(self, consumer: str) -> Policy:
        """The policy for ``consumer``: ``INBOX_CONSUMERS[consumer]`` over the global settings
        (remembered, as the settings are: hot paths ask for it per message)."""
        name = f"policy:{consumer}"
        try:
            return self._cache[name]  # type: ignore[no-any-return]
        except KeyError:
            found = self._cache[name] = self._policy(consumer)
            return found

    def _policy(self, consumer: str) -> Policy:
        overrides = self.consumers.get(consumer) or {}
        values: dict[str, Any] = {}
        for key, setting in POLICY_KEYS.items():
            values[key] = overrides[key] if key in overrides else self._get(setting)
        return Policy(
            max_attempts=int(values["max_attempts"]),
            backoff_base=to_seconds(values["backoff_base"]),
            backoff_max=to_seconds(values["backoff_max"]),
            lease=to_seconds(values["lease"]),
            retention=to_seconds(values["retention"]),
            allow_replay_completed=bool(values["allow_replay_completed"]),
            commit_every=int(values["commit_every"]),
            dead_retention=(
                None if values["dead_retention"] is None else to_seconds(values["dead_retention"])
            ),
            tombstone_retention=(
                None
                if values["tombstone_retention"] is None
                else to_seconds(values["tombstone_retention"])
            ),
            redelivery_window=to_seconds(values["redelivery_window"]),
            ordered=bool(values["ordered"]),
            gap_timeout=to_seconds(values["gap_timeout"]),
            first_sequence=int(values["first_sequence"]),
            side_effects_on_rerun=str(values["side_effects_on_rerun"]),
        )

    def ordered(self, consumer: str) -> bool:
        """Whether ``consumer`` orders its keyed messages (remembered: the hot path asks)."""
        name = f"ordered:{consumer}"
        try:
            return bool(self._cache[name])
        except KeyError:
            value = self._cache[name] = self.policy(consumer).ordered
            return bool(value)


inbox_settings = InboxSettings()


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting.startswith("INBOX_"):
        inbox_settings.reload()


setting_changed.connect(_setting_changed)
