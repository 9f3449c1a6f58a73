"""The loop behind ``manage.py inbox_process``: claim due rows, run their handlers, repeat."""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field

from .. import clock
from ..conf import inbox_settings
from ..db.connection import conflicted, connection_lost, describe, keep_connection
from ..db.outage import Outage
from ..models import InboxMessage
from ..ordered import gaps, waits
from ..registry import registry
from . import interruptions
from .attempts import process_batch, run_released
from .claims import claim_batch
from .giving_back import give_back_interrupted, release
from .leases import is_shared
from .shutdown import Shutdown

logger = logging.getLogger("django_inbox")
#: Seconds a worker waits (at random between the two) before its next pass after a conflict
#: in its own statements, so that two workers that deadlocked do not meet again at once.
CONFLICT_PAUSE = (0.05, 0.5)

#: Seconds between two looks for ordered consumers' gaps past their timeout.
GAP_SWEEP_EVERY = 1.0
#: Seconds between two looks for ordered versions waiting behind a predecessor that was
#: deleted (:func:`~django_inbox.ordered.gaps.rearm_orphans`): a safety net, as nothing should leave
#: one.
REARM_EVERY = 300.0


@dataclass
class WorkerStats:
    outcomes: Counter[str] = field(default_factory=Counter)
    released: int = 0

    @property
    def handled(self) -> int:
        return sum(self.outcomes.values())


class Worker:
    """Processes stored messages of some consumers until told to stop.

    Args:
        consumers: consumers to serve; all consumers with handlers when empty.
        batch_size: rows claimed per query (``INBOX_BATCH_SIZE`` when ``None``).
        max_messages: stop after handling this many messages.
        until_idle: stop once nothing was due for this many seconds (``0``: when drained).
        poll_interval: sleep between polls when nothing is due.
        commit_every: run this many messages per transaction (overrides each consumer's
            ``commit_every`` policy; see :func:`~django_inbox.processing.attempts.process_batch`).
        shutdown: stop requests (signals); a new one when ``None``.
    """

    def __init__(
        self,
        consumers: list[str] | None = None,
        *,
        batch_size: int | None = None,
        max_messages: int | None = None,
        until_idle: float | None = None,
        poll_interval: float | None = None,
        commit_every: int | None = None,
        shutdown: Shutdown | None = None,
    ) -> None:
        self.consumers = list(consumers or [])
        self.batch_size = batch_size or inbox_settings.batch_size
        self.max_messages = max_messages
        self.until_idle = until_idle
        self.poll_interval = (
            inbox_settings.poll_interval if poll_interval is None else poll_interval
        )
        self.commit_every = commit_every
        self.shutdown = shutdown or Shutdown()
        self.stats = WorkerStats()
        self.using = inbox_settings.database
        #: After a shared-transaction batch was cut short, run the next one message per
        #: transaction: if a handler killed the connection, it shows which one.
        self._solo = False
        self._next_gap_sweep = 0.0
        self._next_rearm = time.monotonic() + REARM_EVERY

    def _consumers(self) -> list[str]:
        return self.consumers or registry.consumers()

    def _room(self) -> int:
        if self.max_messages is None:
            return self.batch_size
        return min(self.batch_size, self.max_messages - self.stats.handled)

    def run_once(self) -> int:
        """Claim and process one batch per consumer; return how many messages were handled.

        Raises the database's error if the connection is lost; the rows this pass held are
        then noted for :func:`~django_inbox.processing.giving_back.give_back_interrupted`.
        """
        handled = 0
        solo, self._solo = self._solo, False
        if time.monotonic() >= self._next_gap_sweep:
            self._next_gap_sweep = time.monotonic() + GAP_SWEEP_EVERY
            rearm = time.monotonic() >= self._next_rearm
            if rearm:
                self._next_rearm = time.monotonic() + REARM_EVERY
            for consumer in self._consumers():
                if not inbox_settings.ordered(consumer):
                    waits.release_unordered(consumer, self.using)  # no longer ordered
                    continue
                if rearm:
                    gaps.rearm_orphans(self.using, consumer=consumer)
                gaps.park_expired_gaps(self.using, consumer=consumer)
        for consumer in self._consumers():
            room = self._room()
            if room <= 0 or self.shutdown.requested:
                break
            commit_every = self.commit_every or inbox_settings.policy(consumer).commit_every
            if solo:
                commit_every = 1
            batch = claim_batch(consumer, room, shared_transaction=commit_every > 1)
            if not batch[:1] or not is_shared(batch[0].lease_id):
                commit_every = 1
            for start in range(0, len(batch), commit_every):
                chunk = batch[start : start + commit_every]
                if self.shutdown.requested or _lease_ran_out(chunk[-1]):
                    self.stats.released += release(batch[start:])
                    break
                try:
                    attempts = process_batch(chunk)
                except Exception as exc:
                    if connection_lost(exc, self.using) or conflicted(exc):
                        # One message running alone was interrupted; a shared batch blames
                        # nobody (as when its worker dies) and the next pass runs solo.
                        running = chunk[0] if len(chunk) == 1 else None
                        self._solo = running is None
                        interruptions.note(
                            batch[start:], using=self.using, running=running, error=exc
                        )
                    raise
                outcomes = [attempted.outcome for attempted in attempts]
                for attempted in attempts:  # ordered consumers: the versions they made due
                    if attempted.released and not self.shutdown.requested:
                        outcomes += run_released(
                            consumer,
                            list(attempted.released),
                            self.using,
                            stop=lambda: self.shutdown.requested,
                        )
                for outcome in outcomes:
                    self.stats.outcomes[outcome.value] += 1
                handled += len(outcomes)
        return handled

    def run(self) -> WorkerStats:
        """Process until stopped, ``max_messages`` are handled or idle for ``until_idle``.

        The database going away (a restart, a terminated connection, no free slot) does not
        end the loop: it reconnects with backoff and gives back what it held, uncounted. Nor
        does a deadlock or a lock timeout in the worker's own statements (a claim, a gap
        sweep, a shared batch's commit): it gives back what it held and tries again. A
        database that refuses the connection for its settings (no such database or role, a
        wrong password) ends it: :class:`~django_inbox.db.outage.DatabaseMisconfigured`.
        """
        idle_since = time.monotonic()
        outage = Outage(self.using, "inbox worker", self.shutdown.wait)
        while not self.shutdown.requested:
            try:
                keep_connection(self.using)
                give_back_interrupted(self.using)
                handled = self.run_once()
            except Exception as exc:
                if conflicted(exc) and not connection_lost(exc, self.using):
                    # A deadlock or lock timeout in the worker's own statements: nothing of
                    # them committed, and the rows a shared batch held were noted to give back.
                    logger.warning("inbox worker: %s; trying again", describe(exc))
                    self.shutdown.wait(random.uniform(*CONFLICT_PAUSE))
                    continue
                if not connection_lost(exc, self.using):
                    raise
                outage.wait(exc)
                idle_since = time.monotonic()  # an outage is not idleness
                continue
            outage.over()
            if handled:
                idle_since = time.monotonic()
            elif self.until_idle is not None and time.monotonic() - idle_since >= self.until_idle:
                break
            else:
                self.shutdown.wait(self._sleep_for(idle_since))
            if self.max_messages is not None and self.stats.handled >= self.max_messages:
                break
        return self.stats

    def _sleep_for(self, idle_since: float) -> float:
        if self.until_idle is None:
            return self.poll_interval
        left = self.until_idle - (time.monotonic() - idle_since)
        return max(0.0, min(self.poll_interval, left))


def _lease_ran_out(message: InboxMessage) -> bool:
    """A row whose lease passed while it waited in the batch may already be someone else's."""
    return message.locked_until is not None and message.locked_until <= clock.now()
