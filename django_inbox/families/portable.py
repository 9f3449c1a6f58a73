"""Every transition whose SQL differs between database families, through Django's ORM:
correct on every database (what SQLite, MariaDB and MySQL run), in more round trips."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Max, QuerySet

from .. import history
from ..db import tombstones
from ..db.aside import with_status
from ..db.statements import KeyState, Taken
from ..db.tombstones import Keeping
from ..models import InboxKey, InboxMessage
from ..processing import leases

Status = InboxMessage.Status

#: The changes an operator's action makes to a row, given the status it leaves.
Changes = dict[str, Any] | Callable[[str], dict[str, Any]]


class Portable:
    """Every transition through Django's ORM: correct on every database, more round trips."""

    #: Whether :meth:`change_appending_history` appends in SQL (the rows' ``history`` need
    #: not be read first).
    history_in_sql = False

    # -- claims ---------------------------------------------------------------------------

    def claim_fresh(
        self, consumer: str, limit: int, lease_id: str, until: datetime, now: datetime, using: str
    ) -> list[InboxMessage]:
        """Due rows claimed in one statement; ``[]``: none, or take the general claim."""
        return []

    def claim_message(
        self,
        consumer: str,
        message_id: str,
        lease_id: str,
        until: datetime,
        now: datetime,
        using: str,
    ) -> list[InboxMessage]:
        """One due message claimed by its id in one statement; ``[]``: take the general
        claim."""
        return []

    # -- an ordered consumer's keys -------------------------------------------------------

    def lock_key(
        self, consumer: str, key: str, first: int, using: str, *, wait: bool
    ) -> KeyState | None:
        """Lock ``key``'s row for the caller's transaction and return its state
        (``first - 1`` applied for a new key); ``None``: another transaction holds it and
        ``wait`` is false."""
        connection = connections[using]
        plain = rows = InboxKey.objects.using(using).filter(consumer=consumer, key=key)
        columns = ("applied_sequence", "rerun_through")
        if connection.features.has_select_for_update:
            if connection.features.has_select_for_update_skip_locked and not wait:
                rows = rows.select_for_update(skip_locked=True)
            else:
                rows = rows.select_for_update()
            found = list(rows.values_list(*columns))
            if found:
                return KeyState(*found[0])
            if not wait and plain.exists():
                # Skipped: another transaction holds the key. The insert below would wait for
                # it (MariaDB's INSERT IGNORE) or not lock it at all (ON CONFLICT DO NOTHING).
                return None
        # A new key (or, on SQLite, any key: the insert takes the database's write lock
        # before the read, so two processes cannot both read the same applied sequence).
        InboxKey.objects.using(using).bulk_create(
            [InboxKey(consumer=consumer, key=key, applied_sequence=first - 1)],
            ignore_conflicts=True,
        )
        found = list(rows.values_list(*columns))
        return KeyState(*found[0]) if found else None

    def lock_for_worker(self, message: InboxMessage, first: int, using: str) -> Taken:
        """A worker's lock of a claimed version's key, never waiting."""
        state = self.lock_key(message.consumer, message.key, first, using, wait=False)
        return Taken(state, False, None, [])

    def advance(
        self, consumer: str, key: str, sequence: int, now: datetime, using: str
    ) -> list[str]:
        """In the run's transaction: ``key`` has applied ``sequence``; make the next version
        due. Returns the message ids made due."""
        InboxKey.objects.using(using).filter(consumer=consumer, key=key).update(
            applied_sequence=sequence, updated_at=now
        )
        return self.release_next(consumer, key, sequence + 1, now, using)

    def release_next(
        self, consumer: str, key: str, sequence: int, now: datetime, using: str
    ) -> list[str]:
        """Make ``key``'s waiting rows of ``sequence`` due now (under the key's lock)."""
        version = InboxMessage.objects.using(using).filter(
            consumer=consumer, key=key, sequence=sequence
        )
        rows = with_status(version, Status.WAITING)  # found by the key's versions index
        ids = list(rows.values_list("message_id", flat=True))
        if ids:
            rows.update(status=Status.RECEIVED, next_attempt_at=now, updated_at=now, last_error="")
        return ids

    def complete_applied(
        self, message: InboxMessage, now: datetime, using: str
    ) -> tuple[bool, list[str]]:
        """The fenced completion of a claimed version its key's lock recorded applied, and
        the release of the next version: whether the lease still held the row, and the
        message ids made due."""
        assert message.sequence is not None
        if not leases.complete(message, now, using):
            return False, []
        return True, self.release_next(
            message.consumer, message.key, message.sequence + 1, now, using
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
        """A claimed version that does not run now: ``waiting`` or ``skipped``, its claim's
        attempt taken back; fenced on its lease."""
        changes: dict[str, Any] = {"next_attempt_at": next_attempt_at, "last_error": last_error}
        if status == Status.SKIPPED:
            changes["processed_at"] = now
        return leases.set_aside(message, status, changes, now, using)

    # -- purge ---------------------------------------------------------------------------

    def purge_pages(
        self, rows: QuerySet[InboxMessage], using: str
    ) -> QuerySet[InboxMessage] | None:
        """``rows`` as a purge pages through them by primary key (:meth:`delete_batch`);
        ``None``: nothing to purge.

        Without partial indexes (MySQL, MariaDB) a page's ``ORDER BY id LIMIT n`` reads the
        primary key until it has ``n`` rows: past the last expired row that is the rest of
        the table, and with nothing expired the whole of it. There the pages stop at the last
        expired row, found first on the index of finished rows (``django_inbox_finished_idx``,
        or the attention index for dead rows), which reads only theirs."""
        if connections[using].features.supports_partial_indexes:
            return rows
        last = rows.aggregate(last=Max("pk"))["last"]
        return None if last is None else rows.filter(pk__lte=last)

    def delete_batch(
        self,
        rows: QuerySet[InboxMessage],
        status: str,
        limit: int,
        using: str,
        keep: Keeping | None = None,
    ) -> tuple[list[int], int]:
        """In the caller's transaction: delete the first ``limit`` of ``rows`` by primary key
        (all in ``status``), skipping rows another transaction holds, and with ``keep`` keep
        their tombstones; return their ids and how many tombstones were kept. The rows are
        selected, locked, then deleted: MariaDB and MySQL refuse a ``LIMIT`` inside ``IN (…)``,
        and MySQL has no ``DELETE … RETURNING``."""
        chosen = rows.order_by("pk")
        if connections[using].features.has_select_for_update_skip_locked:
            chosen = chosen.select_for_update(skip_locked=True)
        found = list(chosen.values_list("pk", "consumer", "message_id", "processed_at")[:limit])
        if not found:
            return [], 0
        ids = [pk for pk, *_ in found]
        with_status(InboxMessage.objects.using(using).filter(pk__in=ids), status).delete()
        if keep is None:
            return ids, 0
        gone = [(consumer, message_id, done) for _, consumer, message_id, done in found]
        return ids, tombstones.write(gone, keep, using)

    # -- an operator's actions ------------------------------------------------------------

    def change_appending_history(
        self,
        rows: list[InboxMessage],
        changes: Changes,
        entry: dict[str, Any],
        now: datetime,
        using: str,
    ) -> list[InboxMessage]:
        """Change ``rows`` (locked, still in the status they were read in), appending
        ``entry`` with each row's status and attempts before the change; return the rows
        changed. ``changes`` may depend on the status a row leaves."""
        changed = []
        for row in rows:
            values = changes(row.status) if callable(changes) else changes
            kept = {**entry, "from": row.status, "attempts": row.attempts}
            if (
                InboxMessage.objects.using(using)
                .filter(pk=row.pk, status=row.status)
                .update(
                    **{**values, "updated_at": now, "history": history.append(row.history, kept)}
                )
            ):
                changed.append(row)
        return changed
