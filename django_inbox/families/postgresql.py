"""The transitions PostgreSQL does with statements of its own (``db/statements/``), over
:class:`~django_inbox.families.portable.Portable`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet

from .. import clock
from ..db import statements
from ..db.statements import KeyState, Taken
from ..db.tombstones import Keeping
from ..models import InboxMessage
from .portable import Changes, Portable


class PostgreSQL(Portable):
    """The transitions PostgreSQL does with statements of its own (``db/statements/``)."""

    history_in_sql = True

    def claim_fresh(
        self, consumer: str, limit: int, lease_id: str, until: datetime, now: datetime, using: str
    ) -> list[InboxMessage]:
        return statements.claim_fresh(consumer, limit, lease_id, until, now, using)

    def claim_message(
        self,
        consumer: str,
        message_id: str,
        lease_id: str,
        until: datetime,
        now: datetime,
        using: str,
    ) -> list[InboxMessage]:
        return statements.claim_message(consumer, message_id, lease_id, until, now, using)

    def lock_key(
        self, consumer: str, key: str, first: int, using: str, *, wait: bool
    ) -> KeyState | None:
        return statements.lock_key(consumer, key, first, using, wait=wait)

    def lock_for_worker(self, message: InboxMessage, first: int, using: str) -> Taken:
        """When the version is its key's next one (and the key has a row), one statement
        records it applied, completes the row (fenced on its lease) and makes the next
        version due, before the handler runs (an operator's skip ahead is not completed: it
        goes ``skipped``)."""

        rerun = bool(message.rerun)
        if message.sequence is None or message.skip_requested:
            state, moved = statements.lock_and_apply(
                message.consumer, message.key, message.sequence, first, using, rerun=rerun
            )
            return Taken(state, moved, None, [])
        return statements.lock_apply_complete(
            message.consumer,
            message.key,
            message.sequence,
            first,
            message.pk,
            message.lease_id,
            clock.now(),
            using,
            rerun=rerun,
        )

    def advance(
        self, consumer: str, key: str, sequence: int, now: datetime, using: str
    ) -> list[str]:
        return statements.advance(consumer, key, sequence, now, using)

    def complete_applied(
        self, message: InboxMessage, now: datetime, using: str
    ) -> tuple[bool, list[str]]:
        assert message.sequence is not None
        return statements.complete_ordered(
            message.pk,
            message.lease_id,
            message.consumer,
            message.key,
            message.sequence,
            now,
            using,
        )

    def set_aside(
        self,
        message: InboxMessage,
        status: str,
        next_attempt_at: datetime | None,
        last_error: str,
        now: datetime,
        using: str,
    ) -> bool:
        return statements.set_aside(
            message.pk, message.lease_id, status, next_attempt_at, last_error, now, using
        )

    def delete_batch(
        self,
        rows: QuerySet[InboxMessage],
        status: str,
        limit: int,
        using: str,
        keep: Keeping | None = None,
    ) -> tuple[list[int], int]:
        """One statement: ``DELETE … WHERE id = ANY(ARRAY(<the locking selection>)) AND status
        = … RETURNING id``, and with ``keep`` the tombstones' ``INSERT`` in the same statement
        (see :func:`django_inbox.db.statements.delete_selected`)."""
        inner = rows.order_by("pk").values("pk")[:limit].select_for_update(skip_locked=True)
        sql, params = inner.query.get_compiler(using).as_sql()
        return statements.delete_selected(sql, list(params), status, using, keep)

    def change_appending_history(
        self,
        rows: list[InboxMessage],
        changes: Changes,
        entry: dict[str, Any],
        now: datetime,
        using: str,
    ) -> list[InboxMessage]:
        """One statement per status left (one in all when ``changes`` is the same for all),
        the entry built in SQL from each row's old values."""
        if not rows:
            return rows
        statuses = sorted({row.status for row in rows})
        groups = [statuses] if not callable(changes) else [[status] for status in statuses]
        for group in groups:
            values = changes(group[0]) if callable(changes) else changes
            statements.update_appending_history(
                [row.pk for row in rows if row.status in group],
                group,
                {**values, "updated_at": now},
                entry,
                using,
            )
        return rows
