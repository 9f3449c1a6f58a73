"""The outbox's system check: ``django_inbox.E018``, its settings."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register

from ..conf import DEFAULTS
from ..durations import to_seconds


def _setting(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


@register(Tags.compatibility)
def check_outbox_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E018: the outbox's settings (registered when the outbox app is ready)."""
    errors: list[CheckMessage] = []
    attempts = _setting("INBOX_OUTBOX_MAX_ATTEMPTS")
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        errors.append(
            Error(
                f"INBOX_OUTBOX_MAX_ATTEMPTS must be a positive integer, got {attempts!r}.",
                id="django_inbox.E018",
            )
        )
    seconds: dict[str, float] = {}
    for name in (
        "INBOX_OUTBOX_BACKOFF_BASE",
        "INBOX_OUTBOX_BACKOFF_MAX",
        "INBOX_OUTBOX_LEASE",
        "INBOX_OUTBOX_CONFIRM_TIMEOUT",
        "INBOX_OUTBOX_RETENTION",
    ):
        try:
            seconds[name] = to_seconds(_setting(name))
            if seconds[name] <= 0:
                raise ValueError("it must be more than zero seconds")
        except ValueError as exc:
            errors.append(Error(f"{name}: {exc}.", id="django_inbox.E018"))
    lease = seconds.get("INBOX_OUTBOX_LEASE")
    timeout = seconds.get("INBOX_OUTBOX_CONFIRM_TIMEOUT")
    if lease and timeout and lease < 2 * timeout:
        errors.append(
            Error(
                f"INBOX_OUTBOX_LEASE ({lease:g}s) is less than twice INBOX_OUTBOX_CONFIRM_TIMEOUT "
                f"({timeout:g}s): a relay still waiting for confirms would lose its rows to "
                "another relay, which publishes them again.",
                hint="Raise the lease or lower the confirm timeout.",
                id="django_inbox.E018",
            )
        )
    return errors
