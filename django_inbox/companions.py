"""Apps that live beside the inbox and report through it, without the inbox importing them.

The optional outbox (``django_inbox.outbox``) registers a :class:`Companion` from its
``AppConfig.ready()``. The inbox's stats and problems (``inbox_stats``, the health view, the
admin's banner, Prometheus), ``inbox_purge --outbox`` and the Celery tasks ask :func:`outbox`
for it and go without when the app is not installed: the core never imports the outbox, and
the outbox may import the core.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from django.apps import apps

#: The outbox's app name, as in ``INSTALLED_APPS``.
OUTBOX = "django_inbox.outbox"


class Companion(Protocol):
    """What the inbox asks of an app beside it."""

    def collect(self, now: datetime) -> Any:
        """Its stats, as ``InboxStats.outbox`` holds them."""

    def problems(self, stats: Any, max_pending_age: float) -> list[tuple[str, float, str]]:
        """``(kind, value, message)`` for each problem in ``stats``."""

    def purge(self, *, older_than: float | None, batch_size: int) -> int:
        """Delete what its retention no longer keeps; return how many rows."""

    def relay(
        self, broker_url: str, *, max_messages: int | None, max_seconds: float, batch_size: int
    ) -> dict[str, Any]:
        """Publish for at most ``max_seconds``, then return what was done."""


_registered: dict[str, Companion] = {}


def register(app_name: str, companion: Companion) -> None:
    """Called by an app's ``AppConfig.ready()``."""
    _registered[app_name] = companion


def get(app_name: str) -> Companion | None:
    """The companion of ``app_name`` if that app is installed (and ready), else ``None``."""
    if not apps.is_installed(app_name):
        return None
    return _registered.get(app_name)


def outbox() -> Companion | None:
    """The outbox's companion, or ``None`` without ``django_inbox.outbox`` installed."""
    return get(OUTBOX)
