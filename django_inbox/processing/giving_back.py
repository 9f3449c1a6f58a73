"""Claimed rows given back unrun: a worker's unstarted rows on a graceful stop
(:func:`release`), and what a lost database connection cut short, once the database answers
again (:func:`give_back_interrupted`, from the notes of
:mod:`django_inbox.processing.interruptions`)."""

from __future__ import annotations

from django.db import transaction

from .. import clock, history
from ..conf import inbox_settings
from ..exceptions import ConnectionLost
from ..models import InboxMessage
from ..outcomes import Outcome
from ..registry import registry
from . import interruptions, leases
from .attempts import record_failure
from .retry import RetryPolicy


def release(messages: list[InboxMessage], *, using: str | None = None) -> int:
    """Give back claimed rows that were never started (e.g. on shutdown), attempt uncounted."""
    using = using or inbox_settings.database
    now = clock.now()
    with transaction.atomic(using=using):
        return sum(leases.release(message, now, using) for message in messages)


def give_back_interrupted(using: str | None = None) -> int:
    """Give back the rows noted in :mod:`~django_inbox.processing.interruptions`; return how many.

    Call once the database answers again. Rows that were waiting are due now with their
    attempt uncounted; the row that was running gets an ``interrupted`` history entry, free
    for its first ``max_attempts`` interruptions and recorded as a failed attempt
    (``ConnectionLost``) after that. Rows another worker took over meanwhile are left alone.
    """
    using = using or inbox_settings.database
    if not interruptions.pending():
        return 0
    noted = interruptions.take(using)
    given = 0
    try:
        now = clock.now()
        with transaction.atomic(using=using):
            for entry in noted:
                if entry.lease_id is not None:
                    given += leases.release_lease(entry.lease_id, now, using)
                for row in entry.rows:
                    if row is not entry.running:
                        given += leases.release(row, now, using)
        for entry in noted:
            if entry.running is not None:
                given += _give_back_running(entry.running, entry.error, using)
    except Exception:
        interruptions.put_back(noted)
        raise
    return given


def _give_back_running(row: InboxMessage, error: str, using: str) -> int:
    handler = registry.get(row.consumer, row.event_type)
    policy = RetryPolicy.for_handler(row.consumer, handler)
    if not policy.used_up(interruptions.free_interruptions(row)):
        entry = history.interrupted_entry(row.attempts, error, at=clock.now())
        return leases.release_interrupted(row, entry, using)
    reason = (
        f"the database connection was lost during attempt {row.attempts}"
        + (f" ({error})" if error else "")
        + "; this message's earlier interruptions used up its free ones, so this one counts"
    )
    outcome = record_failure(row, ConnectionLost(reason), handler, using=using)
    return 0 if outcome is Outcome.IN_PROGRESS else 1
