"""``deliver_batch()``: several messages delivered in one transaction (a broker consumer's
prefetched messages, :mod:`django_inbox.broker.acking`); what it cannot do for all of them at
once goes through :func:`django_inbox.intake.delivery.deliver_row` one by one."""

from __future__ import annotations

import logging
import time

from .. import clock
from ..conf import inbox_settings
from ..db.connection import connection_lost
from ..models import InboxMessage
from ..ordered import ordering
from ..outcomes import Outcome
from ..processing.attempts import processed
from ..processing.calling import run_handler
from ..processing.commits import committing
from ..registry import registry
from .delivery import deliver_existing, deliver_row
from .rows import NewRow, fresh, insert_completed, materialise

logger = logging.getLogger("django_inbox")
Status = InboxMessage.Status


def deliver_batch(rows: list[NewRow]) -> list[Outcome]:
    """Deliver several prepared messages in one transaction; one :class:`Outcome` each.

    The new messages' rows go in with one statement, every handler runs in the same
    transaction, and one commit covers them all. If any handler raises, the transaction rolls
    back and each message is delivered again on its own (its handler then runs twice, as with
    ``commit_every``), so a failure is recorded against the message that caused it.
    """
    using = inbox_settings.database
    batch = [fresh(row) for row in rows]  # the caller's rows stay as given, to try again
    handlers = [registry.get(row.consumer, row.event_type) for row in batch]
    if (
        len(batch) < 2
        or None in handlers
        or any(ordering.applies(r.consumer, r.key) for r in batch)
    ):
        return [deliver_row(row, using) for row in batch]
    now = clock.now()
    for row in batch:
        row.status, row.attempts, row.processed_at = Status.COMPLETED, 1, now
    ran: dict[tuple[str, str], InboxMessage] = {}
    started = time.perf_counter()
    try:
        with committing(using, lambda: [message.pk for message in ran.values()]):
            new = insert_completed(batch, now, using)
            for row, handler in zip(batch, handlers, strict=True):
                key = (row.consumer, row.message_id)
                if key in new and key not in ran:
                    ran[key] = message = materialise(row, new[key], using)
                    run_handler(handler, message, using)  # type: ignore[arg-type]
    except Exception as exc:
        if connection_lost(exc, using):
            raise  # nothing committed (or unknown): the caller tries the batch again later
        logger.info("inbox batch of %d rolled back; delivering one by one", len(batch))
        return [deliver_row(fresh(row), using) for row in batch]
    share = (time.perf_counter() - started) / max(len(ran), 1)
    outcomes: list[Outcome] = []
    for row in batch:
        key = (row.consumer, row.message_id)
        if key in ran:
            processed(ran.pop(key), share, using)
            outcomes.append(Outcome.PROCESSED)
        else:  # a duplicate: of a row committed earlier, or of one earlier in this batch
            outcomes.append(deliver_existing(fresh(row), using))
    return outcomes
