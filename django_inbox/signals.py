"""Django signals for what happens to messages, sent after the change commits.

Every signal is sent with ``sender=InboxMessage`` and these keyword arguments:

``consumer``, ``message_id``, ``event_type``
    Which message.
``pk``
    The row's primary key (``None`` for a duplicate whose row was not read).
``attempt``
    The attempt concerned (``0`` when none ran).
``duration``
    Seconds the handler ran (``None`` when no handler ran).
``message``
    The :class:`~django_inbox.models.InboxMessage` when one was at hand, else ``None``.
    Receivers must not log or export its payload or headers.
``extra``
    A dict of details of the signal: ``error_type`` and ``retry_at`` for ``message_failed``;
    ``error_type`` for ``message_dead`` and ``message_parked``; ``actor``, ``via``,
    ``reason`` and ``previous_status`` for ``message_replayed``; ``outcome`` for
    ``message_reclaimed``; ``function`` for ``side_effect_suppressed``.

Signals are sent when the transaction that made the change commits (at once outside one), so a
receiver never hears of work that was rolled back. With no receiver connected, sending costs a
dictionary lookup: nothing is built.

A receiver that raises does not stop the others, nor the inbox: its failure is logged on the
``django_inbox`` logger with the exception's type and frames but not its message, which may
quote the payload (Django's own ``send_robust`` log line, which quotes it, is not written).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.dispatch import Signal

from .text import exception_text

if TYPE_CHECKING:
    from .models import InboxMessage

logger = logging.getLogger("django_inbox")


class _Signal(Signal):
    def _log_robust_failure(self, receiver: Any, err: Exception) -> None:
        """Django (5.0+) logs a failing receiver with its exception's message, which may quote
        the payload; :func:`send` logs it without."""


#: A new message was stored (its first delivery).
message_received = _Signal()
#: A delivery of a message that was already completed: acknowledged, nothing ran.
message_duplicate = _Signal()
#: A handler's work committed and the message is ``completed``.
message_processed = _Signal()
#: An attempt failed; the message will be retried at ``extra["retry_at"]``.
message_failed = _Signal()
#: The message went ``dead``: attempts used up, ``Reject``, no handler, or undecodable.
message_dead = _Signal()
#: The message was parked (``Park`` from its handler, or an operator).
message_parked = _Signal()
#: An operator replayed the message (``inbox_replay``, the admin, the service function).
message_replayed = _Signal()
#: An ordered consumer skipped a stale version (its key had applied that sequence already).
message_skipped = _Signal()
#: An ordered consumer's message waits for an earlier sequence of its key.
message_waiting = _Signal()
#: A re-run of a completed message did not make a ``@side_effect`` call (its consumer's policy
#: is ``"side_effects_on_rerun": "suppress"``); ``extra["function"]`` names it.
side_effect_suppressed = _Signal()
#: The message's worker died or hung; its row was taken over (``extra["outcome"]``: the status).
message_reclaimed = _Signal()

SIGNALS = {
    "received": message_received,
    "duplicate": message_duplicate,
    "processed": message_processed,
    "failed": message_failed,
    "dead": message_dead,
    "parked": message_parked,
    "replayed": message_replayed,
    "reclaimed": message_reclaimed,
    "skipped": message_skipped,
    "waiting": message_waiting,
    "suppressed": side_effect_suppressed,
}


def _model() -> type[InboxMessage]:
    from .models import InboxMessage

    return InboxMessage


def listened(signal: Signal) -> bool:
    """Whether anyone listens: senders skip building arguments when nobody does."""
    return bool(signal.receivers) and signal.has_listeners(_model())


def send(
    signal: Signal, arguments: dict[str, Any], extra: dict[str, Any], using: str | None
) -> None:
    """Send ``signal`` once the current transaction on ``using`` commits (now in autocommit).

    ``arguments`` are the keyword arguments every signal has (``consumer``, ``message_id``,
    ``event_type``, ``pk``, ``attempt``, ``duration``, ``message``); ``extra`` is sent as
    ``extra``, its datetimes as ISO 8601 text.
    """
    if not listened(signal):
        return
    extra = {
        key: value.isoformat() if isinstance(value, datetime) else value
        for key, value in extra.items()
    }

    def fire() -> None:
        results = signal.send_robust(sender=_model(), **arguments, extra=extra)
        for receiver, error in results:
            if isinstance(error, Exception):
                logger.error(
                    "inbox signal receiver %s failed for %s %s: %s",
                    _name(receiver),
                    arguments["consumer"],
                    arguments["message_id"],
                    exception_text(error),
                )

    transaction.on_commit(fire, using=using)


def _name(receiver: Any) -> str:
    name = getattr(receiver, "__qualname__", None)
    module = getattr(receiver, "__module__", None)
    return f"{module}.{name}" if name and module else repr(receiver)
