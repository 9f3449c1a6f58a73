"""Helpers shared by the tests of ordered consumers and re-runs (``test_ordering``, ``test_gaps``,
``test_ordered_operator_actions``, ``test_ordered_edges``, ``test_side_effects``,
``test_services_rerun``): versions of a key sent with ``deliver()`` or stored with ``store()``,
a worker drained to idle, a consumer's policy changed for one test, and the test project's sent
side effects cleared around each test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from django.test import override_settings
from effects import inbox_handlers

from django_inbox import Outcome, deliver, store
from django_inbox.models import InboxMessage
from django_inbox.processing.worker import Worker


@pytest.fixture(autouse=True)
def sent_cleared() -> Iterator[None]:
    """The test project's sent side effects (``effects.inbox_handlers.SENT``), empty before
    and after each test of a module that imports this fixture."""
    inbox_handlers.SENT.clear()
    yield
    inbox_handlers.SENT.clear()


def drain(*consumers: str, idle: float = 0.0, **options: Any) -> None:
    """Run a worker for ``consumers`` until nothing has been due for ``idle`` seconds."""
    Worker(list(consumers), until_idle=idle, poll_interval=0.01, **options).run()


def policy(consumer: str, **changes: Any) -> override_settings:
    """``consumer``'s policy in ``INBOX_CONSUMERS`` with ``changes``, for a ``with`` block."""
    consumers = {**settings.INBOX_CONSUMERS}
    consumers[consumer] = {**consumers[consumer], **changes}
    return override_settings(INBOX_CONSUMERS=consumers)


@dataclass(frozen=True)
class Versions:
    """Versions of keys of one ordered consumer, message id ``<key>-<sequence>`` unless given;
    with ``numbered`` the payload carries the sequence as ``n`` (what a projection applies)."""

    consumer: str
    event_type: str
    numbered: bool = False

    def fields(
        self, key: str, sequence: int | None, message_id: str | None, payload: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "message_id": message_id or f"{key}-{sequence}",
            "event_type": self.event_type,
            "payload": {"n": sequence, **payload} if self.numbered else payload,
            "key": key,
            "sequence": sequence,
        }

    def send(
        self, key: str, sequence: int | None, message_id: str | None = None, **payload: Any
    ) -> Outcome:
        """``deliver()`` a version: run now if it is its key's next one."""
        return deliver(**self.fields(key, sequence, message_id, payload))

    def put(
        self, key: str, sequence: int | None, message_id: str | None = None, **payload: Any
    ) -> bool:
        """``store()`` a version for the workers."""
        return store(**self.fields(key, sequence, message_id, payload))

    def row(self, message_id: str) -> InboxMessage:
        return InboxMessage.objects.get(consumer=self.consumer, message_id=message_id)
