"""One call per thing that happens to a message: a structured log line and a signal.

Log lines go to the ``django_inbox`` logger with the message's ids and what happened, never
its payload or headers. Each record carries the fields as attributes for structured (JSON)
formatters: ``inbox_consumer``, ``inbox_message_id``, ``inbox_event_type``,
``inbox_attempt``, ``inbox_outcome``, ``inbox_duration_ms`` and, where it applies,
``inbox_error_type``, ``inbox_retry_at``. Levels: ``DEBUG`` for received and duplicate,
``INFO`` for processed and replayed, ``WARNING`` for failed, parked and reclaimed, ``ERROR``
for dead. Nothing is formatted unless the level is enabled, and no signal argument is built
unless a receiver is connected.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from . import signals
from .text import printable

if TYPE_CHECKING:
    from .models import InboxMessage

logger = logging.getLogger("django_inbox")

LEVELS = {
    "received": logging.DEBUG,
    "duplicate": logging.DEBUG,
    "skipped": logging.INFO,
    "waiting": logging.INFO,
    "processed": logging.INFO,
    "replayed": logging.INFO,
    "suppressed": logging.INFO,
    "failed": logging.WARNING,
    "parked": logging.WARNING,
    "reclaimed": logging.WARNING,
    "dead": logging.ERROR,
}


class About(TypedDict):
    """The fields of :func:`event` that name a stored row."""

    consumer: str
    message_id: str
    event_type: str
    pk: int | None
    attempt: int
    using: str | None


class _Row(Protocol):
    consumer: str
    message_id: str
    event_type: str
    attempts: int


def about(
    row: _Row, using: str | None, *, pk: int | None = None, attempt: int | None = None
) -> About:
    """What :func:`event` says of ``row`` (a stored row or a new one): its ids and the attempt
    it is on; ``pk`` and ``attempt`` default to the row's own."""
    return {
        "consumer": row.consumer,
        "message_id": row.message_id,
        "event_type": row.event_type,
        "pk": pk if pk is not None else getattr(row, "pk", None),
        "attempt": row.attempts if attempt is None else attempt,
        "using": using,
    }


def event(
    kind: str,
    *,
    consumer: str,
    message_id: str,
    event_type: str,
    pk: int | None = None,
    attempt: int = 0,
    duration: float | None = None,
    message: InboxMessage | None = None,
    using: str | None = None,
    error_type: str | None = None,
    retry_at: datetime | None = None,
    detail: str = "",
    send_signal: bool = True,
    **extra: Any,
) -> None:
    """Log ``kind`` (``processed``, ``failed``, …) for a message and send its signal (unless
    ``send_signal`` is false: the caller sends it later, where the database may be used)."""
    kind = str(kind)  # a plain string in the record, even when given a status
    level = LEVELS[kind]
    if logger.isEnabledFor(level):
        fields: dict[str, Any] = {
            "inbox_consumer": consumer,
            "inbox_message_id": message_id,
            "inbox_event_type": event_type,
            "inbox_attempt": attempt,
            "inbox_outcome": kind,
            "inbox_duration_ms": None if duration is None else round(duration * 1000, 3),
            "inbox_error_type": error_type,
            "inbox_retry_at": retry_at.isoformat() if retry_at else None,
        }
        text = (
            f"inbox {printable(consumer)}/{printable(event_type)} {printable(message_id)} "
            f"attempt {attempt}: {kind}"
        )
        if error_type:
            text += f" ({error_type})"
        if duration is not None:
            text += f" in {duration * 1000:.1f} ms"
        if retry_at is not None:
            text += f"; retry at {retry_at.isoformat()}"
        if detail:
            text += f"; {detail}"
        logger.log(level, "%s", text, extra=fields)
    signal = signals.SIGNALS[kind]
    if send_signal and signals.listened(signal):
        if error_type is not None:
            extra["error_type"] = error_type
        if retry_at is not None:
            extra["retry_at"] = retry_at
        arguments = {
            "consumer": consumer,
            "message_id": message_id,
            "event_type": event_type,
            "pk": pk,
            "attempt": attempt,
            "duration": duration,
            "message": message,
        }
        signals.send(signal, arguments, extra, using)
