"""System checks for what users can get wrong. Ids: ``django_inbox.E0xx`` / ``W0xx``."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from .broker.checks import check_broker_settings  # noqa: F401  (registers the broker checks)
from .conf import DEFAULTS, POLICY_KEYS, SIDE_EFFECTS_CHOICES, UNHANDLED_CHOICES
from .db.checks import check_database  # noqa: F401  (registers the database checks)
from .durations import to_seconds
from .registry import registry
from .task_checks import check_inbox_tasks  # noqa: F401  (registers the Celery task checks)

#: The deepest INBOX_MAX_JSON_DEPTH allowed: a value this deep decodes from any call stack.
MAX_JSON_DEPTH = 256


def _setting(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


@register(Tags.compatibility)
def check_handler_modules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    return [
        Error(
            f"The inbox handler module {path!r} failed to import; its handlers are not "
            "registered and their messages would go dead.",
            hint=tb.strip().splitlines()[-1] if tb.strip() else None,
            obj=path,
            id="django_inbox.E001",
        )
        for path, tb in registry.import_errors
    ]


def _policy_errors(where: str, values: dict[str, Any]) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for key, check_id in (
        ("max_attempts", "django_inbox.E002"),
        ("commit_every", "django_inbox.E011"),
    ):
        value = values.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                Error(
                    f"{where} {key.replace('_', ' ')} must be a positive integer, got {value!r}.",
                    id=check_id,
                )
            )
    seconds: dict[str, float] = {}
    for key in ("backoff_base", "backoff_max", "lease", "retention", "redelivery_window"):
        if key not in values:
            continue
        try:
            seconds[key] = to_seconds(values[key])
        except ValueError as exc:
            errors.append(Error(f"{where} {key}: {exc}.", id="django_inbox.E003"))
    for key in ("dead_retention", "tombstone_retention"):
        if values.get(key) is None:
            continue
        try:
            to_seconds(values[key])
        except ValueError as exc:
            errors.append(Error(f"{where} {key}: {exc} (or None).", id="django_inbox.E003"))
    if "ordered" in values and not isinstance(values["ordered"], bool):
        errors.append(
            Error(
                f"{where} ordered must be True or False, got {values['ordered']!r}.",
                id="django_inbox.E016",
            )
        )
    first = values.get("first_sequence", 1)
    if isinstance(first, bool) or not isinstance(first, int) or first < 0:
        errors.append(
            Error(
                f"{where} first sequence must be an integer >= 0, got {first!r}.",
                id="django_inbox.E016",
            )
        )
    if "gap_timeout" in values:
        try:
            if to_seconds(values["gap_timeout"]) <= 0:
                raise ValueError("it must be more than zero seconds")
        except ValueError as exc:
            errors.append(Error(f"{where} gap_timeout: {exc}.", id="django_inbox.E016"))
    rerun = values.get("side_effects_on_rerun", "run")
    if rerun not in SIDE_EFFECTS_CHOICES:
        name = f"{where} side_effects_on_rerun"
        if where == "INBOX_*":
            name = "INBOX_SIDE_EFFECTS_ON_RERUN"
        errors.append(
            Error(
                f"{name} must be one of {SIDE_EFFECTS_CHOICES}, got {rerun!r}.",
                hint="'suppress' skips @side_effect calls while a completed message re-runs.",
                id="django_inbox.E017",
            )
        )
    if "backoff_base" in seconds and seconds["backoff_base"] <= 0:
        errors.append(
            Error(f"{where} backoff base must be more than zero seconds.", id="django_inbox.E003")
        )
    if (
        "backoff_base" in seconds
        and "backoff_max" in seconds
        and seconds["backoff_max"] < seconds["backoff_base"]
    ):
        errors.append(
            Error(
                f"{where} backoff max ({seconds['backoff_max']}s) is shorter than its base "
                f"({seconds['backoff_base']}s).",
                id="django_inbox.E003",
            )
        )
    if "lease" in seconds and seconds["lease"] < 1:
        errors.append(
            Error(
                f"{where} lease is {seconds['lease']}s; a lease under a second expires while "
                "handlers still run, so their work is rolled back and retried for ever.",
                id="django_inbox.E004",
            )
        )
    return errors


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors = _policy_errors("INBOX_*", {key: _setting(name) for key, name in POLICY_KEYS.items()})

    consumers = _setting("INBOX_CONSUMERS")
    if not isinstance(consumers, dict):
        errors.append(
            Error(
                "INBOX_CONSUMERS must be a dict of consumer name to policy dict.",
                id="django_inbox.E005",
            )
        )
        consumers = {}
    known = registry.consumers(load=False)
    if any(name not in known for name in consumers):
        # Perhaps an @inbox_task consumer, whose module loads only when asked for.
        known = registry.consumers()
    for name, policy in consumers.items():
        if not isinstance(policy, dict):
            errors.append(
                Error(f"INBOX_CONSUMERS[{name!r}] must be a dict.", id="django_inbox.E005")
            )
            continue
        unknown = sorted(set(policy) - set(POLICY_KEYS))
        if unknown:
            errors.append(
                Error(
                    f"INBOX_CONSUMERS[{name!r}] has unknown keys {unknown}.",
                    hint=f"Known keys: {', '.join(POLICY_KEYS)}.",
                    id="django_inbox.E005",
                )
            )
        errors.extend(_policy_errors(f"INBOX_CONSUMERS[{name!r}]", policy))
        if known and name not in known:
            errors.append(
                Warning(
                    f"INBOX_CONSUMERS names {name!r}, which has no handlers.",
                    hint=f"Consumers with handlers: {', '.join(known)}. A typo?",
                    id="django_inbox.W001",
                )
            )

    unhandled = _setting("INBOX_UNHANDLED")
    if unhandled not in UNHANDLED_CHOICES:
        errors.append(
            Error(
                f"INBOX_UNHANDLED must be one of {UNHANDLED_CHOICES}, got {unhandled!r}.",
                id="django_inbox.E006",
            )
        )
    try:
        to_seconds(_setting("INBOX_POLL_INTERVAL"))
    except ValueError as exc:
        errors.append(Error(f"INBOX_POLL_INTERVAL: {exc}.", id="django_inbox.E010"))
    try:
        to_seconds(_setting("INBOX_MAX_PENDING_AGE"))
    except ValueError as exc:
        errors.append(Error(f"INBOX_MAX_PENDING_AGE: {exc}.", id="django_inbox.E014"))
    if not any(message.is_serious() for message in errors):  # a W001 must not hide a W003
        errors.extend(_retention_warnings(consumers))
    if _setting("INBOX_METRICS"):
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            errors.append(
                Error(
                    "INBOX_METRICS is on but prometheus-client is not installed.",
                    hint="pip install 'django-transactional-inbox[prometheus]', or set "
                    "INBOX_METRICS = False.",
                    id="django_inbox.E015",
                )
            )
    for name, most in (
        ("INBOX_MAX_PAYLOAD_BYTES", None),
        ("INBOX_BATCH_SIZE", 100_000),
        ("INBOX_PREFETCH", 65_535),  # AMQP's prefetch count: 16 bits
    ):
        value = _setting(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append(
                Error(f"{name} must be a positive integer, got {value!r}.", id="django_inbox.E007")
            )
        elif most is not None and value > most:
            errors.append(
                Error(f"{name} must be at most {most:,}, got {value!r}.", id="django_inbox.E007")
            )
    depth = _setting("INBOX_MAX_JSON_DEPTH")
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= MAX_JSON_DEPTH:
        errors.append(
            Error(
                f"INBOX_MAX_JSON_DEPTH must be an integer from 1 to {MAX_JSON_DEPTH}, got "
                f"{depth!r}.",
                hint="Deeper values can exhaust the recursion of the processes that decode them.",
                id="django_inbox.E019",
            )
        )
    return errors


def retry_horizon(consumer: str) -> float:
    """Seconds from a message's first attempt to its last, at worst: every backoff at its
    ceiling and every attempt running until its lease expires."""
    from .processing.retry import RetryPolicy

    handlers = [h for h in registry if h.consumer == consumer] or [None]
    horizon = 0.0
    for handler in handlers:
        policy = RetryPolicy.for_handler(consumer, handler)
        waits = sum(policy.ceiling(attempt) for attempt in range(1, policy.max_attempts))
        horizon = max(horizon, waits + policy.max_attempts * policy.lease)
    return horizon


def _retention_warnings(consumers: dict[str, Any]) -> list[CheckMessage]:
    """W003: completed rows purged before a late duplicate can still arrive."""
    from .conf import inbox_settings

    warnings: list[CheckMessage] = []
    #: The horizon the warning about the global retention was given for, if it was.
    global_horizon: float | None = None
    names = [None, *sorted(set(consumers) | set(registry.consumers(load=False)))]
    for name in names:
        own = consumers.get(name) or {} if name is not None else {}
        policy = inbox_settings.policy(name or "")
        horizon = policy.redelivery_window + retry_horizon(name or "")
        if (
            name is not None
            and global_horizon is not None
            and not {"retention", "redelivery_window"} & set(own)
            and horizon <= global_horizon
        ):
            continue  # already warned about the global retention this consumer uses
        if policy.retention < horizon:
            if name is None:
                global_horizon = horizon
            where = "INBOX_RETENTION" if name is None else f"consumer {name!r}: retention"
            warnings.append(
                Warning(
                    f"{where} ({_days(policy.retention)}) is shorter than the window in which "
                    f"a duplicate can still arrive ({_days(horizon)}: INBOX_REDELIVERY_WINDOW "
                    "plus the longest retry schedule). inbox_purge would delete rows a late "
                    "duplicate needs, and that duplicate would be processed again.",
                    hint="Raise the retention, or lower INBOX_REDELIVERY_WINDOW if your brokers "
                    "and producers cannot redeliver that late.",
                    obj=name or "INBOX_RETENTION",
                    id="django_inbox.W003",
                )
            )
    return warnings


def _days(seconds: float) -> str:
    return f"{seconds / 86400:.1f} days" if seconds >= 86400 else f"{seconds:.0f}s"
