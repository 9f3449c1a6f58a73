"""What becomes of one broker message: delivered, stored, kept dead, or refused at the broker.

:class:`Intake` turns a kombu message into a :class:`Decision` for the connection loop
(:mod:`~django_inbox.broker.connection`), which acknowledges only after the decision's work has
committed. Database errors are raised to the loop; everything else ends in a decision:

- a message without an id is refused (an id invented here would defeat deduplication);
- a message with an id that cannot be read or stored as it is (an undecodable body, an
  unknown codec, a NUL in its type, a reader that raised) is kept ``dead`` under its id, with
  its raw body and the reason, and acknowledged: never requeued for ever.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..exceptions import InvalidMessage, InvalidMessageId, UnknownEventType
from ..intake.delivery import deliver
from ..intake.rows import NewRow, prepare
from ..intake.storing import KEY_LOST, store, store_dead
from ..registry import registry
from ..text import exception_text, storable
from . import amqp_guard
from .envelope import Envelope, identity, raw_body

logger = logging.getLogger("django_inbox")


class AckMode(StrEnum):
    AFTER_PROCESS = "after-process"
    AFTER_STORE = "after-store"


class Action(StrEnum):
    """What the loop does with the broker message once the decision's work committed."""

    ACK = "ack"
    #: Reject without requeueing: the broker dead-letters it (or drops it, without a DLX).
    REFUSE = "refuse"
    #: Held in the open batch; acknowledged after the batch commits.
    PENDING = "pending"


@dataclass
class Decision:
    action: Action
    #: What happened in the inbox, for counts and the ``-v 2`` line: ``processed``,
    #: ``duplicate``, ``stored``, ``dead``, ``refused``…; ``None`` for a pending message.
    outcome: str | None = None
    message_id: str | None = None
    #: The prepared row of a pending message.
    row: NewRow | None = None
    #: Why a refused message was refused (kept with it where the broker can keep a reason).
    reason: str = ""


class Intake:
    """Decides each message of one queue for one inbox consumer (see the module docstring).

    Args:
        consumer: the inbox consumer.
        queue_name: for log lines.
        ack_mode: ``after-process`` runs the handler before the ack, ``after-store`` stores.
        batching: whether ordinary messages may wait in an open batch (``commit_every > 1``
            and ``after-process``).
        envelope: reads a kombu message into an :class:`Envelope`.
        raw_limit: bytes of an unreadable body kept for an operator.
    """

    def __init__(
        self,
        *,
        consumer: str,
        queue_name: str,
        ack_mode: AckMode,
        batching: bool,
        envelope: Callable[..., Envelope],
        raw_limit: int,
    ) -> None:
        self.consumer = consumer
        self.queue_name = queue_name
        self.ack_mode = ack_mode
        self.batching = batching
        self.envelope = envelope
        self.raw_limit = raw_limit
        amqp_guard.install()  # before any frame is read: see its module

    def decide(self, message: Any, flush: Callable[[], object]) -> Decision:
        """Read and decide ``message``; raises only database errors (nothing committed).

        ``flush`` commits the open batch: it is called before anything else is committed,
        so messages commit in the order they arrived.
        """
        try:
            envelope = self.envelope(message, raw_limit=self.raw_limit)
        except Exception as exc:
            flush()
            return self.unreadable(message, exc)
        if self._batchable(envelope):
            try:
                row = prepare(payload=envelope.payload, **self._fields(envelope))
            except InvalidMessage:
                pass  # decided one by one below, after the batch
            else:
                return Decision(Action.PENDING, message_id=envelope.message_id, row=row)
        flush()
        return self._decide(envelope)

    def _fields(self, envelope: Envelope) -> dict[str, Any]:
        return {
            "consumer": self.consumer,
            "message_id": envelope.message_id,
            "event_type": envelope.event_type or "unknown",
            "headers": envelope.headers,
            # Never cut: two keys sharing their first 255 characters would become one.
            "source": envelope.source,
            "key": envelope.key,
            "sequence": envelope.sequence,
        }

    def _decide(self, envelope: Envelope) -> Decision:
        if not envelope.message_id:
            logger.error(
                "inbox_consume %s: refused a message without an id from queue %s (type %s); %s",
                self.consumer,
                self.queue_name,
                storable(envelope.event_type or "-"),
                storable(envelope.problem)
                if envelope.problem
                else "an id invented here would defeat deduplication",
            )
            why = envelope.problem or "the message has no id"
            return Decision(Action.REFUSE, "refused", reason=f"refused by inbox_consume: {why}")
        message_id = envelope.message_id
        fields = self._fields(envelope)
        try:
            if envelope.problem or not envelope.event_type:
                reason = envelope.problem or "the message has no event type"
                kind = KEY_LOST if envelope.key_lost else "Undecodable"
                return self._keep_dead(fields, envelope.payload, reason, kind)
            if self.ack_mode is AckMode.AFTER_STORE:
                new = store(payload=envelope.payload, **fields)
                return Decision(Action.ACK, "stored" if new else "duplicate", message_id)
            outcome = deliver(payload=envelope.payload, redelivered=envelope.redelivered, **fields)
            return Decision(Action.ACK, outcome.value, message_id)
        except UnknownEventType as exc:
            logger.error("inbox_consume %s: refused message %s: %s", self.consumer, message_id, exc)
            reason = f"refused by inbox_consume: {exc}"
            return Decision(Action.REFUSE, "refused", message_id, reason=reason)
        except InvalidMessageId as exc:
            logger.error(
                "inbox_consume %s: refused a message with an unusable id: %s", self.consumer, exc
            )
            reason = f"refused by inbox_consume: unusable id: {exc}"
            return Decision(Action.REFUSE, "refused", None, reason=reason)
        except InvalidMessage as exc:
            # The payload or a field cannot be stored as it is: kept dead, with the reason.
            return self._keep_dead(fields, envelope.payload, str(exc), type(exc).__name__)

    def _batchable(self, envelope: Envelope) -> bool:
        return bool(
            self.batching
            and envelope.message_id
            and not envelope.problem
            and not envelope.redelivered
            and envelope.event_type
            and registry.get(self.consumer, envelope.event_type) is not None
        )

    def _keep_dead(self, fields: dict[str, Any], payload: Any, reason: str, kind: str) -> Decision:
        """Store the message ``dead`` (fields cleaned by :func:`store_dead`) and ack it."""
        try:
            store_dead(payload=payload, reason=reason, error_type=kind, **fields)
        except InvalidMessage as exc:  # the id itself cannot be stored
            logger.error(
                "inbox_consume %s: refused a message that cannot be kept: %s", self.consumer, exc
            )
            reason = f"refused by inbox_consume: it cannot be kept: {exc}"
            return Decision(Action.REFUSE, "refused", None, reason=reason)
        return Decision(Action.ACK, "dead", fields["message_id"])

    def unreadable(self, message: Any, exc: BaseException) -> Decision:
        """The reader (or the inbox) failed on ``message`` with ``exc``: keep it dead under its
        id, with its raw body, if it has one; refuse it at the broker if not."""
        # The type and the frames, not the message: it may quote the payload.
        logger.error(
            "inbox_consume %s: could not read a message from queue %s: %s",
            self.consumer,
            self.queue_name,
            exception_text(exc),
        )
        message_id = identity(message)
        if not message_id:
            why = f"it could not be read ({type(exc).__name__}) and has no id"
            return Decision(Action.REFUSE, "refused", reason=f"refused by inbox_consume: {why}")
        fields = {
            "consumer": self.consumer,
            "message_id": message_id,
            "event_type": _property(message, "type") or "unknown",
            "headers": {},
        }
        reason = f"the message could not be read: {type(exc).__name__}: {exc}"
        return self._keep_dead(fields, raw_body(message, self.raw_limit), reason, "Unreadable")


def _property(message: Any, name: str) -> str:
    try:
        value = (message.properties or {}).get(name)
    except Exception:
        return ""
    return value if isinstance(value, str) else ""
