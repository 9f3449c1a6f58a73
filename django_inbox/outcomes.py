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
    """

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    IN_PROGRESS = "in_progress"
    FAILED = "failed"
    DEAD = "dead"
    PARKED = "parked"
