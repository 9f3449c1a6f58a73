"""System checks of the settings ``inbox_consume`` and the outbox's relay read to reach a
broker: its URL, kombu's transport options, the envelope reader and the AMQP heartbeat."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.utils.module_loading import import_string

from ..conf import DEFAULTS
from ..durations import to_seconds

#: AMQP sends the heartbeat as whole seconds in 16 bits.
MAX_HEARTBEAT = 65_535


def _setting(name: str) -> Any:
    return getattr(settings, name, DEFAULTS[name])


@register(Tags.compatibility)
def check_broker_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    broker_url = _setting("INBOX_BROKER_URL")
    if broker_url is not None and (not isinstance(broker_url, str) or "://" not in broker_url):
        errors.append(
            Error(
                f"INBOX_BROKER_URL must be a kombu URL such as 'amqp://…' or None, "
                f"got {broker_url!r}.",
                id="django_inbox.E012",
            )
        )
    if not isinstance(_setting("INBOX_BROKER_TRANSPORT_OPTIONS"), dict):
        errors.append(
            Error("INBOX_BROKER_TRANSPORT_OPTIONS must be a dict.", id="django_inbox.E012")
        )
    envelope = _setting("INBOX_ENVELOPE")
    try:
        if not isinstance(envelope, str) or not callable(import_string(envelope)):
            raise ImportError(f"{envelope!r} is not the dotted path of a callable")
    except ImportError as exc:
        errors.append(
            Error(
                f"INBOX_ENVELOPE {envelope!r} cannot be imported as a callable: {exc}.",
                id="django_inbox.E013",
            )
        )
    errors.extend(_heartbeat_errors())
    return errors


def _heartbeat_errors() -> list[CheckMessage]:
    """0 (off), or whole seconds from 1 to :data:`MAX_HEARTBEAT`."""
    try:
        seconds = to_seconds(_setting("INBOX_BROKER_HEARTBEAT") or 0)
    except ValueError as exc:
        return [Error(f"INBOX_BROKER_HEARTBEAT: {exc}.", id="django_inbox.E010")]
    if seconds and (seconds != int(seconds) or not 1 <= seconds <= MAX_HEARTBEAT):
        return [
            Error(
                f"INBOX_BROKER_HEARTBEAT: {seconds:g} s; AMQP takes whole seconds from 1 to "
                f"{MAX_HEARTBEAT:,} (or 0 for none).",
                id="django_inbox.E010",
            )
        ]
    return []
