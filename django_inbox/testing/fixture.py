"""The ``inbox`` fixture and the :class:`Inbox` it gives. PYTEST_DONT_REWRITE."""

from __future__ import annotations

from collections.abc import Callable
from importlib.util import find_spec
from typing import TYPE_CHECKING

from ..outcomes import Outcome
from .checks import check_exactly_once
from .crash import crash_after_handler, simulate_crash
from .deliveries import deliver_times, deliver_twice
from .worker import run_worker

if TYPE_CHECKING:
    from ..models import InboxMessage


class Inbox:
    """The helpers of this module as methods, plus lookups: what the ``inbox`` fixture gives."""

    deliver_times = staticmethod(deliver_times)
    deliver_twice = staticmethod(deliver_twice)
    simulate_crash = staticmethod(simulate_crash)
    crash_after_handler = staticmethod(crash_after_handler)
    run_worker = staticmethod(run_worker)
    check_exactly_once = staticmethod(check_exactly_once)

    @property
    def deliver(self) -> Callable[..., Outcome]:
        """:func:`django_inbox.deliver` (imported when first used, so this module imports
        before Django is set up)."""
        from ..intake.delivery import deliver

        return deliver

    @property
    def store(self) -> Callable[..., bool]:
        """:func:`django_inbox.store`: keep the message for :meth:`run_worker`."""
        from ..intake.storing import store

        return store

    @staticmethod
    def row(consumer: str, message_id: str) -> InboxMessage:
        """The inbox row of a message, read now (``InboxMessage.DoesNotExist`` if none)."""
        from ..conf import inbox_settings
        from ..models import InboxMessage

        return InboxMessage.objects.using(inbox_settings.database).get(
            consumer=consumer, message_id=message_id
        )

    @staticmethod
    def errors(consumer: str, message_id: str) -> list[str]:
        """The ``type`` of each failed attempt in the message's history, oldest first."""
        return [entry["type"] for entry in Inbox.row(consumer, message_id).errors]


if find_spec("pytest") is not None:  # the fixture, for pytest_plugins = ["django_inbox.testing"]
    import pytest

    @pytest.fixture
    def inbox(db: None) -> Inbox:
        """The testing helpers, with database access.

        The test's ``django_db`` mark decides the kind of access: with
        ``@pytest.mark.django_db(transaction=True)`` every inbox transaction commits;
        without, the test runs inside one transaction, as in a ``TestCase``.
        """
        return Inbox()
