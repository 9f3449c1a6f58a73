"""Entries a transport fails on before they are messages: logged, counted, and never the end
of ``inbox_consume``.

kombu's Redis transport pops an entry and then decodes its envelope inside ``drain_events``:
an entry that is not one of kombu's (raw text, a JSON list, nesting past Python's recursion,
written to the list by something else) raises there, after kombu took it. py-amqp can fail on
a delivery it cannot decode in ways :mod:`.amqp_guard` does not foresee. Either way the inbox
never saw a message: it logs the failure (the exception's type and frames, never its text,
which may quote the entry), counts it, and reads on. Many in a row are taken for a broken
connection, which the loop makes again with its backoff.
"""

from __future__ import annotations

import logging

from kombu.exceptions import OperationalError as BrokerUnavailable

from ..text import exception_text
from .acking import ConsumeStats

logger = logging.getLogger("django_inbox")

#: Entries the transport cannot read, one after another, before the connection is made again.
MAX_IN_A_ROW = 10


class TransportFaults:
    """The entries one consumer's transport could not read (see the module)."""

    def __init__(self, consumer: str, queue_name: str, scheme: str, stats: ConsumeStats) -> None:
        self.consumer = consumer
        self.queue_name = queue_name
        self.scheme = scheme
        self.stats = stats
        self.in_a_row = 0

    def met(self, exc: Exception, *, settling: bool = False) -> None:
        """Log and count ``exc``; raise ``BrokerUnavailable`` after :data:`MAX_IN_A_ROW`.

        ``settling``: the failure was acknowledging or refusing a message the inbox had
        decided (its decision is committed; unacknowledged, the broker delivers it again)."""
        self.in_a_row += 1
        if settling:
            logger.error(
                "inbox_consume %s: the %s transport could not acknowledge or refuse a message "
                "of queue %s (%s); its decision is committed, and the broker delivers it again",
                self.consumer,
                self.scheme,
                self.queue_name,
                exception_text(exc),
            )
        else:
            self.stats.unreadable += 1
            logger.error(
                "inbox_consume %s: the %s transport could not read an entry of queue %s as a "
                "message (%s); it is not in the inbox (kombu's Redis lists have removed it; "
                "the other brokers deliver it again)",
                self.consumer,
                self.scheme,
                self.queue_name,
                exception_text(exc),
            )
        if self.in_a_row >= MAX_IN_A_ROW:
            self.in_a_row = 0
            raise BrokerUnavailable(f"{MAX_IN_A_ROW} unreadable entries in a row") from exc

    def passed(self) -> None:
        """A message was read: the next fault is the first in a row."""
        self.in_a_row = 0
