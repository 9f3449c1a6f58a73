"""``committing()``: the handler's ``transaction.atomic()``, telling a failing ``on_commit``
callback apart from a failure of the work itself."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.db import connections, transaction

from ..db.connection import conflicted, connection_lost
from ..models import InboxMessage
from ..text import exception_text

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status


@contextmanager
def committing(using: str, pks: Callable[[], list[int]]) -> Iterator[None]:
    """``transaction.atomic()`` that does not take a failing ``on_commit`` callback for a
    failure of its body.

    Django runs the callbacks after the commit, inside ``atomic``'s exit, so their exception
    comes out of the block as if the work had failed. Here an exception raised after the body
    finished is swallowed (and logged: type and frames, not its message) when the commit did
    happen, i.e. the rows ``pks()`` are ``completed``; any other exception propagates.
    """
    body_done = False
    try:
        with transaction.atomic(using=using):
            yield
            body_done = True
    except Exception as exc:
        # A lost connection is not asked whether it committed: the check would open a new one
        # and hide the loss from the caller.
        if not body_done or connection_lost(exc, using) or not _committed(exc, pks(), using):
            raise


def _committed(exc: Exception, pks: list[int], using: str) -> bool:
    if connections[using].in_atomic_block:
        return False  # a savepoint: nothing committed, and no callback has run yet
    try:
        done = InboxMessage.objects.using(using).filter(pk__in=pks, status=Status.COMPLETED)
        committed = done.count() == len(pks)
    except Exception:
        return False
    if committed:
        logger.error(
            "inbox: a transaction.on_commit callback raised after %d message(s) committed; "
            "they are completed. Use on_commit(..., robust=True) for callbacks that may fail: %s",
            len(pks),
            exception_text(exc),
        )
    return committed


#: Set on an exception of the inbox's own statements in an attempt (its completion).
OWN = "_inbox_own_statement"


@contextmanager
def own_statements() -> Iterator[None]:
    """Mark what the inbox's own statements raise inside the handler's transaction, so that
    their timeout or conflict is not taken for the handler's failure."""
    try:
        yield
    except Exception as exc:
        setattr(exc, OWN, True)
        raise


def not_the_handlers(exc: BaseException, using: str) -> bool:
    """Whether an attempt's failure is no one's: the database went away, or the inbox's own
    statements (:func:`own_statements`) timed out or met a conflict. The row then goes back
    uncounted instead of being recorded as the handler's failed attempt."""
    return connection_lost(exc, using) or (getattr(exc, OWN, False) and conflicted(exc))
