"""Each broker message through the intake, acknowledged only once its decision committed.

:class:`Acker` holds what a consumer owes the broker between a message's arrival and its
acknowledgement: the open ``--commit-every`` batch, and the message being handled while the
database is away (held, unacknowledged, and tried again once the database answers, so the
broker never redelivers it for an outage).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from django.db import DatabaseError

from ..db.connection import connection_lost, describe, keep_connection
from ..db.outage import DatabaseMisconfigured, Outage
from ..intake.batches import deliver_batch
from ..intake.rows import NewRow
from ..processing.giving_back import give_back_interrupted
from ..processing.retry import ceiling
from ..processing.shutdown import Shutdown
from ..text import exception_text
from .intake import Action, Decision, Intake

logger = logging.getLogger("django_inbox")
T = TypeVar("T")


@dataclass
class ConsumeStats:
    """What a consumer did: outcomes of delivered messages and what it did at the broker."""

    outcomes: Counter[str] = field(default_factory=Counter)
    acked: int = 0
    refused: int = 0
    requeued: int = 0
    reconnects: int = 0
    #: Times the database connection was lost (the consumer waited and reconnected).
    database_outages: int = 0
    #: Consecutive failures of the inbox's own statements with the connection intact (a lock
    #: or statement timeout): each requeues the message after a growing pause.
    database_errors: int = 0
    #: Broker entries the transport itself could not read as messages (a raw item in kombu's
    #: Redis list that is not one of its envelopes): kombu's transport had already removed it.
    unreadable: int = 0

    @property
    def received(self) -> int:
        return self.acked + self.refused


class Acker:
    """Decides, commits and then acknowledges each message of one consumer (see the module).

    Args:
        intake: decides what becomes of each message.
        using: the inbox's database alias.
        commit_every: messages per open batch (1: none).
        shutdown: stop requests; a wait for the database ends on one.
        on_message_done: called with ``(message_id, outcome, seconds)`` after each message is
            acknowledged or refused.
    """

    def __init__(
        self,
        intake: Intake,
        *,
        using: str,
        commit_every: int,
        shutdown: Shutdown,
        on_message_done: Callable[[str | None, str, float], None] | None = None,
    ) -> None:
        self.intake = intake
        self.using = using
        self.commit_every = commit_every
        self.shutdown = shutdown
        self.on_message_done = on_message_done
        self.stats = ConsumeStats()
        self.outage = Outage(using, f"inbox_consume {intake.consumer}", self._wait)
        #: Tells the broker the consumer is alive while it waits for the database (the loop
        #: sets it to its transport's ``keepalive``).
        self.keepalive: Callable[[], None] = lambda: None
        self.pending: list[tuple[Any, NewRow, float]] = []
        #: The broker connection's own errors (set by the loop on each connection): raised
        #: through, never taken for a failure of the message at hand. Acknowledging the open
        #: batch happens inside a message's decision, and a broker lost there is the loop's.
        self.broken: tuple[type[BaseException], ...] = ()

    def with_database(self, work: Callable[[], T]) -> T | None:
        """Run ``work``; while the database is away, wait with backoff and run it again.

        Returns ``None`` if a stop was requested while waiting. Other errors propagate, and so
        does :class:`~django_inbox.db.outage.DatabaseMisconfigured`: a database that refuses
        the connection for its settings is not waited for.
        """
        while True:
            keep_connection(self.using)
            try:
                give_back_interrupted(self.using)
                result = work()
            except Exception as exc:
                if not connection_lost(exc, self.using):
                    raise
                self.stats.database_outages += 1
                self.outage.wait(exc)
                if self.shutdown.requested:
                    return None
                continue
            self.outage.over()
            return result

    def _wait(self, seconds: float) -> bool:
        """Wait ``seconds`` for the database, keeping the broker connection alive every
        second; ``True`` if a stop was requested meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            self.keepalive()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.shutdown.wait(min(left, 1.0)):
                return True

    def _database_error(self, exc: DatabaseError) -> None:
        """A statement of the inbox failed with the connection intact (a lock or statement
        timeout, a deadlock): the message is requeued, after a pause that grows."""
        logger.error(
            "inbox_consume %s: database error (%s); requeueing", self.intake.consumer, describe(exc)
        )
        self._pause()

    def _pause(self) -> None:
        """Wait before the broker hands the requeued message over again: 0.2 s doubling."""
        self.stats.database_errors += 1
        self.shutdown.wait(ceiling(self.stats.database_errors + 1, 0.1, 5.0))

    # -- one message ----------------------------------------------------------------------

    def take(self, message: Any, error: BaseException | None = None) -> None:
        """Decide ``message``; acknowledge it once that committed (or hold it in the batch).

        ``error``: the transport could not decode the message (a ``compression`` header it
        cannot apply, say): it is kept ``dead`` under its id with its raw body, or refused.
        """
        started = time.perf_counter()
        try:
            if error is not None:
                self.flush()  # what came before commits first, as decide() does
                decision = self.with_database(partial(self.intake.unreadable, message, error))
            else:
                decision = self.with_database(lambda: self.intake.decide(message, self.flush))
        except DatabaseMisconfigured:
            raise  # not this message's fault: the command ends, the broker keeps the message
        except DatabaseError as exc:
            self._database_error(exc)
            self.requeue(message)
            return
        except Exception as exc:
            if isinstance(exc, self.broken):
                raise  # the broker went away (acking the open batch): the loop reconnects
            # A failure of the inbox itself on this message: keep it dead rather than
            # requeue it for ever.
            try:
                decision = self.with_database(partial(self.intake.unreadable, message, exc))
            except DatabaseMisconfigured:
                raise
            except Exception as again:  # not even that could be stored: try again later
                logger.error(
                    "inbox_consume %s: could not keep an unreadable message; requeueing: %s",
                    self.intake.consumer,
                    exception_text(again),
                )
                self.requeue(message)
                self._pause()
                return
        if decision is None:  # stopped while the database was away: nothing committed
            self.requeue(message)
            return
        if decision.action is Action.PENDING:
            assert decision.row is not None
            self.pending.append((message, decision.row, started))
            if len(self.pending) >= self.commit_every:
                self.flush()
            return
        self._settle(message, decision, started)

    def _settle(self, message: Any, decision: Decision, started: float) -> None:
        """Acknowledge (or refuse) a message whose decision committed."""
        if decision.action is Action.REFUSE:
            if hasattr(message, "refused_because") and decision.reason:
                message.refused_because = decision.reason  # a transport that keeps the reason
            message.reject(requeue=False)
            self.stats.refused += 1
        else:
            message.ack()
            self.stats.acked += 1
            self.stats.database_errors = 0
        if decision.outcome is not None and decision.outcome != "refused":
            self.stats.outcomes[decision.outcome] += 1
        if self.on_message_done is not None:
            outcome = decision.outcome or decision.action.value
            self.on_message_done(decision.message_id, outcome, time.perf_counter() - started)

    def requeue(self, message: Any) -> None:
        message.requeue()
        self.stats.requeued += 1

    def flush(self) -> None:
        """Deliver the open batch in one transaction, then acknowledge its messages."""
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        rows = [row for _, row, _ in batch]
        try:
            outcomes = self.with_database(lambda: deliver_batch(rows))
        except DatabaseError as exc:
            self._database_error(exc)
            outcomes = None
        if outcomes is None:
            for message, _, _ in batch:
                self.requeue(message)
            return
        for (message, row, started), outcome in zip(batch, outcomes, strict=True):
            self._settle(message, Decision(Action.ACK, outcome.value, row.message_id), started)
