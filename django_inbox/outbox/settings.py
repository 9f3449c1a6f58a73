"""The outbox's settings (``INBOX_OUTBOX_*``), read like the inbox's: on first use, remembered,
forgotten when ``override_settings`` changes them."""

from __future__ import annotations

from ..conf import inbox_settings
from ..durations import to_seconds
from ..intake.validation import ATTEMPTS_MAX


class OutboxSettings:
    @property
    def max_attempts(self) -> int:
        """Publications of a row before it is ``dead`` (at most :data:`ATTEMPTS_MAX`)."""
        return min(int(inbox_settings._get("INBOX_OUTBOX_MAX_ATTEMPTS")), ATTEMPTS_MAX)

    @property
    def backoff_base(self) -> float:
        return to_seconds(inbox_settings._get("INBOX_OUTBOX_BACKOFF_BASE"))

    @property
    def backoff_max(self) -> float:
        return to_seconds(inbox_settings._get("INBOX_OUTBOX_BACKOFF_MAX"))

    @property
    def lease(self) -> float:
        """How long a relay's claim on its rows lasts: past it, another relay takes them."""
        return to_seconds(inbox_settings._get("INBOX_OUTBOX_LEASE"))

    @property
    def confirm_timeout(self) -> float:
        """How long a relay waits for the broker's confirms of a batch."""
        return to_seconds(inbox_settings._get("INBOX_OUTBOX_CONFIRM_TIMEOUT"))

    @property
    def retention(self) -> float:
        """How long ``sent`` rows are kept before ``inbox_purge --outbox`` deletes them."""
        return to_seconds(inbox_settings._get("INBOX_OUTBOX_RETENTION"))


outbox_settings = OutboxSettings()
