"""Exceptions users raise in handlers and receive for bad input."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from .durations import MAX_SECONDS


class InvalidMessage(ValueError):
    """A message was refused before anything was stored. Subclasses say why."""


class InvalidMessageId(InvalidMessage):
    """The message id is missing, empty, too long or not text."""


class InvalidField(InvalidMessage):
    """``consumer``, ``event_type``, ``source`` or ``key`` is empty, too long or not text."""


class InvalidPayload(InvalidMessage):
    """The payload or headers cannot be stored as JSON (not serialisable, NaN/Infinity, NUL)."""


class PayloadTooLarge(InvalidPayload):
    """The encoded payload is larger than ``INBOX_MAX_PAYLOAD_BYTES``."""


class UnknownEventType(InvalidMessage):
    """No handler exists for the message and ``INBOX_UNHANDLED = "refuse"``."""


class UnknownConsumer(InvalidMessage):
    """No handler at all is registered for the consumer (a typo, or handlers not loaded)."""


class HandlerAlreadyRegistered(ImproperlyConfigured):
    """A second handler was registered for one ``(consumer, event_type)``."""


class HandlerOutcome(Exception):
    """Base of the exceptions a handler raises to choose what happens to its message."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


class Reject(HandlerOutcome):
    """The message can never succeed: mark it ``dead`` at once, without retries."""


class Park(HandlerOutcome):
    """Set the message aside as ``parked`` for an operator to look at."""


class Retry(HandlerOutcome):
    """Fail this attempt and retry after ``delay`` seconds (or the policy's backoff)."""

    def __init__(self, reason: str = "", *, delay: float | None = None) -> None:
        super().__init__(reason)
        if delay is not None and not 0 <= delay <= MAX_SECONDS:  # also refuses NaN and inf
            raise ValueError(
                f"Retry delay must be a number of seconds from 0 to {MAX_SECONDS:.0f}, "
                f"got {delay!r}"
            )
        self.delay = delay


class UnreadableMessage(Reject):
    """A stored row's payload or headers could not be decoded: it is ``dead`` without running
    its handler (see :mod:`django_inbox.db.json`)."""


class TransactionAborted(RuntimeError):
    """The handler returned, but its transaction can no longer commit.

    It caught a database error without a savepoint, so PostgreSQL aborted the transaction (or
    Django marked it for rollback). Committing would silently roll back; the attempt fails.
    """


class LeaseLost(Exception):
    """Internal: the worker's lease was taken over; its work was rolled back."""


class ConnectionLost(Exception):
    """Recorded for an attempt the loss of the database connection cut short, once a row's
    free interruptions are used up (see :mod:`django_inbox.processing.interruptions`)."""
