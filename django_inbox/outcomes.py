"""What happened to a delivered message."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """The result of :func:`django_inbox.deliver` and of processing one claimed row.

    ``PROCESSED``: the handler ran and its effects committed with the ``completed`` row.
    ``DUPLICATE``: the message was already completed; the handler did not run.
    ``IN_PROGRESS``: another worker holds the message right now.
    ``FAILED``: the handler raised; the message will be retried after a backoff.
    ``DEAD``: the message will not be retried (``Reject``, attempts exhausted, no handler).
    ``PARKED``: the handler raised ``Park``; an operator decides.
    ``SKIPPED``: an ordered consumer had already applied this sequence of the key (stale);
    the handler did not run. Acknowledge it, as a duplicate.
    ``WAITING``: an ordered consumer's message whose key has not reached the sequence before
    it (a gap, or an earlier version still failing); it runs once that one is applied.
    """

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    IN_PROGRESS = "in_progress"
    FAILED = "failed"
    DEAD = "dead"
    PARKED = "parked"
    SKIPPED = "skipped"
    WAITING = "waiting"
