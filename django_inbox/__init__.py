"""Exactly-once processing of incoming messages for Django: the transactional inbox."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .exceptions import (
    HandlerAlreadyRegistered,
    InvalidField,
    InvalidMessage,
    InvalidMessageId,
    InvalidPayload,
    Park,
    PayloadTooLarge,
    Reject,
    Retry,
    TransactionAborted,
    UnknownConsumer,
    UnknownEventType,
)
from .intake.asynchronous import adeliver, astore
from .outcomes import Outcome
from .registry import inbox_handler
from .side_effect_threads import CarryRunExecutor, carry_run
from .side_effects import current_message, side_effect

if TYPE_CHECKING:
    from .intake.delivery import deliver
    from .intake.storing import store, store_dead

__version__ = "0.1.0"

__all__ = [
    "CarryRunExecutor",
    "HandlerAlreadyRegistered",
    "InvalidField",
    "InvalidMessage",
    "InvalidMessageId",
    "InvalidPayload",
    "Outcome",
    "Park",
    "PayloadTooLarge",
    "Reject",
    "Retry",
    "TransactionAborted",
    "UnknownConsumer",
    "UnknownEventType",
    "adeliver",
    "astore",
    "carry_run",
    "current_message",
    "deliver",
    "inbox_handler",
    "side_effect",
    "store",
    "store_dead",
]


def __getattr__(name: str) -> Any:
    # deliver/store import the model, which needs the app registry: load them on first use so
    # `from django_inbox import inbox_handler` works in settings-time imports.
    if name == "deliver":
        from .intake.delivery import deliver

        return deliver
    if name in ("store", "store_dead"):
        from .intake import storing

        return getattr(storing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
