"""The call of a handler: in the caller's transaction, in a trace span
(:mod:`django_inbox.tracing`), with its ``@side_effect`` context, and refused a commit when
the handler left the transaction aborted. Every path that runs a handler calls it here: a
claimed row's attempt, ``deliver()``, a batch."""

from __future__ import annotations

from .. import side_effects, tracing
from ..db.connection import transaction_aborted
from ..exceptions import TransactionAborted
from ..models import InboxMessage
from ..registry import Handler


def run_handler(handler: Handler, message: InboxMessage, using: str) -> None:
    """Call the handler inside the caller's transaction; refuse to commit an aborted one.

    A re-run of a completed message whose consumer suppresses side effects runs with
    ``@side_effect`` calls skipped; the calls it skipped go into the row's history with the
    completion (here, in the same transaction) or with the failure that is recorded.
    """
    with (
        tracing.attempt_span(message),
        side_effects.handler_context(message, using) as suppressing,
    ):
        handler.func(message)
    _refuse_aborted(using)
    if suppressing is not None and suppressing.functions:
        InboxMessage.objects.using(using).filter(pk=message.pk).update(history=message.history)


def _refuse_aborted(using: str) -> None:
    if transaction_aborted(using):
        raise TransactionAborted(
            "the handler caught a database error without a savepoint, so its transaction "
            "cannot commit; let the error propagate or wrap the statement in "
            "transaction.atomic()"
        )
