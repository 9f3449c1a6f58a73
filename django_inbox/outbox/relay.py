"""The relay: claims pending outbox rows, publishes them with confirms, marks them sent.

One loop, as ``outbox_relay`` runs it: claim a batch (``SKIP LOCKED``, a key's oldest pending
row only), publish it on one confirm-mode channel, then in one ``UPDATE`` mark ``sent`` the
rows the broker confirmed. A row is never marked sent before its confirm; a relay killed
between the confirm and the mark leaves the row pending, and the next claim (after the
lease) publishes it again under the same message id, which the receiving inbox deduplicates.
A broker outage gives the unconfirmed rows back (no attempt counted) and reconnects with a
backoff; a row the broker refuses or returns is retried after a backoff and ends ``dead``
after ``INBOX_OUTBOX_MAX_ATTEMPTS``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, connections

from .. import clock
from ..conf import inbox_settings
from ..db.connection import conflicted, connection_lost
from ..db.outage import misconfigured, refused_for_settings
from ..processing.retry import Backoff, used_up
from ..processing.shutdown import Shutdown
from ..wording import counted
from . import rows
from .health import anything_pending, pending_count
from .progress import PROGRESS_EVERY, Progress, describe, masked
from .publisher import BrokerGone, BrokerUnreachable, Publisher
from .settings import outbox_settings

logger = logging.getLogger("django_inbox.outbox")

#: Seconds between reconnection attempts: doubling from the first to the last.
RECONNECT_FIRST, RECONNECT_MAX = 0.5, 10.0
#: Seconds between sweeps for held rows that nothing released (see ``held.sweep``): every
#: ``SWEEP_EVERY``, or less often if a sweep would take more than ``SWEEP_COST`` of the time
#: (it reads every held row).
SWEEP_EVERY, SWEEP_COST = 5.0, 0.05


@dataclass
class RelayStats:
    """What a relay run did."""

    #: Rows the broker confirmed and this relay marked sent.
    sent: int = 0
    #: Failed publications, by the row's resulting status (``pending`` again, ``dead``).
    failed: Counter[str] = field(default_factory=Counter)
    #: Connections to the broker lost (and made again).
    reconnects: int = 0
    batches: int = 0
    #: Whether the broker was reached at all (``until_idle`` may end a run that never did,
    #: when nothing was pending).
    reached: bool = False


class Relay:
    """Publish the outbox until stopped, idle for ``until_idle`` seconds, or ``max_messages``
    rows were sent.

    Idle means nothing was claimed; while the broker cannot be reached, it means nothing is
    pending at all (rows waiting for the broker are work, not idleness). ``wait_for_broker``:
    raise :class:`BrokerUnreachable` if the broker was not reached within this many seconds
    of starting (``None`` waits for ever); once reached, a lost broker is always waited for.
    ``progress``: called with the lines of :class:`~.progress.Progress` (at most one every
    ``progress_every`` seconds).
    """

    def __init__(
        self,
        broker_url: str,
        *,
        batch_size: int = 100,
        poll_interval: float = 0.2,
        until_idle: float | None = None,
        max_messages: int | None = None,
        transport_options: dict[str, Any] | None = None,
        using: str | None = None,
        publisher_factory: Callable[[], Publisher] | None = None,
        wait_for_broker: float | None = None,
        progress: Callable[[str], None] | None = None,
        progress_every: float = PROGRESS_EVERY,
    ) -> None:
        self.broker_url = broker_url
        #: The broker's URL without its password: what log lines and messages show.
        self.broker = masked(broker_url)
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        self.until_idle = until_idle
        self.max_messages = max_messages
        self.wait_for_broker = wait_for_broker
        self.using = using or inbox_settings.database
        self.shutdown = Shutdown()
        self.stats = RelayStats()
        self.progress = Progress(progress, self.broker, progress_every)
        self._factory = publisher_factory or (
            lambda: Publisher(
                broker_url,
                transport_options=transport_options,
                timeout=outbox_settings.confirm_timeout,
            )
        )
        self._publisher: Publisher | None = None
        self._last_error: BaseException | None = None
        self._reconnect = Backoff(RECONNECT_FIRST, RECONNECT_MAX, jitter=False)
        self._swept_at: float | None = None
        self._sweep_every = SWEEP_EVERY

    def run(self) -> RelayStats:
        started = idle_since = time.monotonic()
        try:
            while not self.shutdown.requested and not self._enough():
                try:
                    if not self._connected():
                        if self.until_idle is not None and anything_pending(self.using):
                            idle_since = time.monotonic()  # work waits for the broker
                        elif self._idle(idle_since):
                            break
                        self._give_up_unless_reached(started)
                        self._back_off()
                        continue
                    clock.refresh(self.using)  # leases on the database's clock
                    self._sweep()
                    done = self.run_once()
                except DatabaseError as exc:
                    if refused_for_settings(exc):  # no such database or role: not an outage
                        raise misconfigured(exc, self.using) from None
                    if conflicted(exc) and not connection_lost(exc, self.using):
                        # A statement of the relay timed out or met a deadlock: nothing of it
                        # committed; what it had claimed comes back after its lease.
                        logger.warning("outbox relay: %s; trying again", exc)
                        self._back_off()
                        continue
                    if not connection_lost(exc, self.using):
                        raise
                    # The database went away: what was claimed comes back after its lease.
                    logger.warning("outbox relay: lost the database (%s); retrying", exc)
                    connections[self.using].close()
                    self._back_off()
                    continue
                self.progress.tick(self.stats.sent, self.stats.failed)
                if done:
                    idle_since = time.monotonic()
                    continue
                if self._idle(idle_since):
                    break
                self.shutdown.wait(self.poll_interval)
        finally:
            if self._publisher is not None:
                self._publisher.close()
        return self.stats

    def _idle(self, since: float) -> bool:
        return self.until_idle is not None and time.monotonic() - since >= self.until_idle

    def _back_off(self) -> None:
        self.shutdown.wait(self._reconnect.next())

    def _give_up_unless_reached(self, started: float) -> None:
        """Raise :class:`BrokerUnreachable` once ``wait_for_broker`` has passed without the
        broker ever answering: a wrong host or port is a configuration error."""
        waited = time.monotonic() - started
        if self.stats.reached or self.wait_for_broker is None or waited < self.wait_for_broker:
            return
        raise BrokerUnreachable(
            f"could not reach the broker at {self.broker} within {waited:.0f}s "
            f"({describe(self._last_error) if self._last_error else 'no answer'}); "
            f"{counted(pending_count(self.using), 'outbox row')} pending; check the "
            "URL, or wait longer with --wait-for-broker"
        )

    def _sweep(self) -> None:
        """Now and then (and first thing), release held rows that nothing else released: the
        publisher of such a row died between its commit and its own release. Best effort: a
        sweep that fails is logged and tried again later, and claims go on."""
        began = time.monotonic()
        if self._swept_at is not None and began - self._swept_at < self._sweep_every:
            return
        try:
            released = rows.sweep(self.using)
        except DatabaseError as exc:
            if connection_lost(exc, self.using):
                raise
            logger.error("outbox relay: the sweep for held rows failed (%s); going on", exc)
            released = 0
        self._swept_at = time.monotonic()
        self._sweep_every = max(SWEEP_EVERY, (self._swept_at - began) / SWEEP_COST)
        if released:
            logger.info("outbox relay: released %s of settled keys", counted(released, "held row"))

    def _enough(self) -> bool:
        return self.max_messages is not None and self.stats.sent >= self.max_messages

    def _connected(self) -> bool:
        """Connected to the broker, or connecting now; ``False`` (said and logged) if it
        cannot be reached. The caller backs off."""
        if self._publisher is not None:
            return True
        publisher = self._factory()
        try:
            publisher.open()
        except Exception as exc:
            publisher.close()
            self._last_error = exc
            logger.warning(
                "outbox relay: broker %s unreachable (%s); retrying in %.1fs",
                self.broker,
                describe(exc),
                self._reconnect.upcoming,
            )
            self.progress.unreachable(exc, lambda: pending_count(self.using))
            return False
        # The delay goes back to its first value after a batch settles, not on connecting: a
        # connection that the broker drops at every batch still backs off.
        self._publisher = publisher
        self.stats.reached = True
        self.progress.reached()
        return True

    def run_once(self) -> int:
        """Claim, publish and settle one batch; return how many rows it held."""
        limit = self.batch_size
        if self.max_messages is not None:
            limit = min(limit, self.max_messages - self.stats.sent)
        lease_id, claimed = rows.claim(limit, self.using)
        claimed = self._give_up(claimed, lease_id)
        if not claimed:
            return 0
        assert self._publisher is not None
        self.stats.batches += 1
        try:
            result = self._publisher.publish(claimed)
        except BrokerGone as gone:
            by_pk = {row.pk: row for row in claimed}
            self.stats.sent += rows.mark_sent(
                gone.result.confirmed, lease_id, self.using, _keys(by_pk, gone.result.confirmed)
            )
            for pk, error in gone.result.unsendable.items():
                self.stats.failed[rows.fail(by_pk[pk], lease_id, error, self.using, dead=True)] += 1
            settled = {*gone.result.confirmed, *gone.result.unsendable}
            rows.give_back(
                [row.pk for row in claimed if row.pk not in settled], lease_id, self.using
            )
            logger.warning(
                "outbox relay: lost the broker %s (%s); reconnecting in %.1fs",
                self.broker,
                gone,
                self._reconnect.upcoming,
            )
            self._publisher.close()
            self._publisher = None
            self.stats.reconnects += 1
            self._back_off()
            return len(claimed)
        by_pk = {row.pk: row for row in claimed}
        self.stats.sent += rows.mark_sent(
            result.confirmed, lease_id, self.using, _keys(by_pk, result.confirmed)
        )
        failures = [(pk, error, False) for pk, error in result.failed.items()]
        failures += [(pk, error, True) for pk, error in result.unsendable.items()]
        for pk, error, never in failures:
            status = rows.fail(by_pk[pk], lease_id, error, self.using, dead=never)
            self.stats.failed[status] += 1
            log = logger.error if status == "dead" else logger.warning
            log(
                "outbox %s %s attempt %d: %s%s",
                by_pk[pk].event_type,
                by_pk[pk].message_id,
                by_pk[pk].attempts,
                status,
                f" ({error})",
            )
        if result.unknown:
            rows.give_back(result.unknown, lease_id, self.using)
        self._reconnect.reset()  # a batch settled: the broker works
        return len(claimed)

    def _give_up(self, claimed: list[rows.Claimed], lease_id: str) -> list[rows.Claimed]:
        """Rows claimed more often than ``INBOX_OUTBOX_MAX_ATTEMPTS`` without a publication that
        settled (each claim stopped a relay, or outlived its lease) are dead now; the others."""
        limit = outbox_settings.max_attempts
        for row in claimed:
            if used_up(row.attempts - 1, limit):  # the claim counted one more
                reason = (
                    f"claimed {row.attempts} times (INBOX_OUTBOX_MAX_ATTEMPTS is {limit}) without "
                    "a publication that settled: a relay stopped on it, or lost its lease"
                )
                self.stats.failed[rows.fail(row, lease_id, reason, self.using, dead=True)] += 1
        return [row for row in claimed if not used_up(row.attempts - 1, limit)]


def _keys(by_pk: dict[int, rows.Claimed], pks: list[int]) -> list[str]:
    """The keys of the rows ``pks``: their next rows are released once these are sent."""
    return [by_pk[pk].key for pk in pks if by_pk[pk].key]
