"""The inbox table: one row per ``(consumer, message_id)``."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from . import clock
from .db.identity import identified, identity_keywords
from .db.json import HistoryField, StoredJSONField
from .intake.validation import ATTEMPTS_MAX as ATTEMPTS_MAX

#: Statuses a worker polls. For ``in_progress`` rows ``next_attempt_at`` is the lease expiry,
#: so one indexed predicate (``status IN … AND next_attempt_at <= now``) finds every row
#: that needs a worker: new, due for retry, or abandoned by a dead worker.
POLLED_STATUSES = ("received", "failed", "in_progress")
#: Statuses that wait for an operator (or, for ``dead``, a purge with a dead retention).
ATTENTION_STATUSES = ("dead", "parked")


class InboxMessageQuerySet(models.QuerySet["InboxMessage"]):
    def for_consumer(self, consumer: str | None) -> InboxMessageQuerySet:
        return self if consumer is None else self.filter(consumer=consumer)

    def identified(self, *pairs: tuple[str, str]) -> InboxMessageQuerySet:
        """Rows whose ``(consumer, message_id)`` is one of ``pairs`` (see :func:`identified`)."""
        return identified(self, *pairs)

    def filter(self, *args: Any, **kwargs: Any) -> InboxMessageQuerySet:
        """``filter()``, and ``get()`` through it: with a consumer (``consumer=`` or
        ``consumer__exact=``) and message ids (``message_id=``, ``message_id__exact=`` or a
        list in ``message_id__in=``) among the keywords, the lookup goes through the unique
        index of identities on PostgreSQL (:func:`identified`), as it went through the unique
        constraint before. Other forms (a ``Q`` of the pair, two chained ``filter()`` calls,
        ``exclude()``) compare the columns, which reads the table there."""
        found = identity_keywords(kwargs)
        if found is None:
            return super().filter(*args, **kwargs)
        pairs, others = found
        return identified(super().filter(*args, **others), *pairs)

    def pending(self) -> InboxMessageQuerySet:
        """Rows that still need processing (new, failed, or being processed)."""
        return self.filter(status__in=POLLED_STATUSES)

    def due(self, now: datetime | None = None) -> InboxMessageQuerySet:
        """Rows a worker may claim now: new, due for retry, or whose lease expired."""
        return self.filter(status__in=POLLED_STATUSES, next_attempt_at__lte=now or clock.now())

    def completed(self) -> InboxMessageQuerySet:
        return self.filter(status=InboxMessage.Status.COMPLETED)

    def failed(self) -> InboxMessageQuerySet:
        return self.filter(status=InboxMessage.Status.FAILED)

    def dead(self) -> InboxMessageQuerySet:
        return self.filter(status=InboxMessage.Status.DEAD)

    def parked(self) -> InboxMessageQuerySet:
        return self.filter(status=InboxMessage.Status.PARKED)

    def stale(self, now: datetime | None = None) -> InboxMessageQuerySet:
        """``in_progress`` rows whose lease has expired: their worker died or hangs."""
        # For in_progress rows next_attempt_at equals locked_until, and is indexed.
        return self.filter(
            status=InboxMessage.Status.IN_PROGRESS, next_attempt_at__lt=now or clock.now()
        )


class InboxMessage(models.Model):
    class Status(models.TextChoices):
        RECEIVED = "received", _("received")
        IN_PROGRESS = "in_progress", _("in progress")
        COMPLETED = "completed", _("completed")
        FAILED = "failed", _("failed")
        DEAD = "dead", _("dead")
        PARKED = "parked", _("parked")
        #: An ordered consumer's message whose sequence is ahead of its key's next one.
        WAITING = "waiting", _("waiting")
        #: An ordered consumer's message whose sequence its key has already applied.
        SKIPPED = "skipped", _("skipped")

    id = models.BigAutoField(primary_key=True)
    consumer = models.CharField(max_length=100)
    message_id = models.CharField(max_length=255)
    source = models.CharField(max_length=255, blank=True, default="")
    event_type = models.CharField(max_length=255)
    key = models.CharField(
        max_length=255, blank=True, default="", help_text=_("Ordering or partition key.")
    )
    sequence = models.BigIntegerField(
        null=True,
        blank=True,
        help_text=_("The key's version (aggregate version); ordered consumers apply in order."),
    )
    payload = StoredJSONField()
    headers = StoredJSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.RECEIVED)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    history = HistoryField(
        default=list,
        blank=True,
        help_text=_("One entry per failed attempt and per operator action, oldest first."),
    )
    received_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    next_attempt_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text=_("When a worker should next look at the row (lease expiry while in progress)."),
    )
    locked_until = models.DateTimeField(null=True, blank=True)
    lease_id = models.CharField(max_length=36, blank=True, default="")
    processed_at = models.DateTimeField(null=True, blank=True)
    rerun = models.BooleanField(
        default=False,
        help_text=_(
            "An operator re-ran this message after it had completed: its handler runs as a "
            "re-run (message.is_rerun), and @side_effect calls follow the consumer's policy."
        ),
    )
    skip_requested = models.BooleanField(
        default=False,
        help_text=_(
            "An operator skipped this version of an ordered consumer: it never runs, and is "
            "skipped (counting as applied) when its key reaches it."
        ),
    )

    objects = InboxMessageQuerySet.as_manager()

    class Meta:
        verbose_name = _("inbox message")
        verbose_name_plural = _("inbox messages")
        constraints = [
            # On PostgreSQL, migration 0011 drops this constraint: the unique index of
            # digests (0010, db/identity.py) enforces it in half the space. Django's state
            # still holds it, so a migration that removes or alters it must skip PostgreSQL,
            # and ON CONFLICT / bulk_create(unique_fields=...) must name the digest index
            # there (db/statements/common.py conflict_target), not these fields.
            models.UniqueConstraint(
                fields=["consumer", "message_id"], name="django_inbox_unique_consumer_message"
            ),
        ]
        # On MySQL and MariaDB, which ignore their conditions, migration 0014 gives the partial
        # indexes led by a status other columns (``status`` first) and adds indexes of their
        # own (django_inbox/db/mysql_indexes.py): a migration that adds, alters or renames one
        # of them must give MySQL its layout again.
        indexes = [
            models.Index(
                fields=["consumer", "next_attempt_at", "id"],
                condition=Q(status__in=POLLED_STATUSES),
                name="django_inbox_polled_idx",
            ),
            # Dead and parked rows are few and are what operators look for: counted by
            # inbox_stats, listed by the admin, selected by inbox_replay and inbox_purge.
            models.Index(
                fields=["consumer", "updated_at"],
                condition=Q(status__in=ATTENTION_STATUSES),
                name="django_inbox_attention_idx",
            ),
            # Ordered consumers: a key's versions (stale checks, the next waiting version, the
            # admin's key view). Rows without a sequence are not in it and cost nothing.
            models.Index(
                fields=["consumer", "key", "sequence"],
                condition=Q(sequence__isnull=False),
                name="django_inbox_sequence_idx",
            ),
            # Waiting rows by gap deadline: the sweep for expired gaps, the stats' waiting age.
            models.Index(
                fields=["consumer", "next_attempt_at"],
                condition=Q(status="waiting"),
                name="django_inbox_waiting_idx",
            ),
            # Dead and parked rows in primary-key order: the batches of inbox_replay and of
            # inbox_purge's dead rows (status IN (…) AND id > last ORDER BY id LIMIT n) read
            # their own rows only, where attention_idx would be read whole and sorted for each.
            models.Index(
                fields=["id"],
                condition=Q(status__in=ATTENTION_STATUSES),
                name="django_inbox_attention_id_idx",
            ),
            # Failed rows waiting for their retry, by due time: few, yet mixed with a backlog
            # of received rows in polled_idx, which holds no status. Counted and grouped apart
            # from that backlog (inbox_stats, the failure groups, the admin's filter). Not on
            # MySQL and MariaDB (migration 0016), where waiting_idx leads with the status.
            models.Index(
                fields=["consumer", "next_attempt_at"],
                condition=Q(status="failed"),
                name="django_inbox_failed_idx",
            ),
            # The admin's key: and source: searches, which an operator runs in an incident: a
            # table of millions of rows is not read for them. Rows without a key or a source
            # are not in them. Not on MySQL and MariaDB (migration 0016).
            models.Index(fields=["key"], condition=~Q(key=""), name="django_inbox_key_idx"),
            models.Index(
                fields=["source"], condition=~Q(source=""), name="django_inbox_source_idx"
            ),
            # Rows a worker holds, by lease: few (workers x batch size) whatever the table
            # holds. inbox_reclaim looks for expired leases here, and a take-over for the rest
            # of a dead worker's batch (takeover.whole_leases).
            models.Index(
                fields=["lease_id"],
                condition=Q(status="in_progress"),
                name="django_inbox_in_progress_idx",
            ),
        ]
        permissions = [
            ("replay_inboxmessage", "Can replay dead or parked inbox messages"),
            ("force_replay_inboxmessage", "Can re-run completed inbox messages"),
            ("park_inboxmessage", "Can park inbox messages"),
            ("retry_inboxmessage", "Can retry failed inbox messages now"),
            ("skip_inboxmessage", "Can skip versions of ordered consumers' messages"),
            ("view_payload_inboxmessage", "Can see inbox message payloads and headers"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer}:{self.message_id} ({self.status})"

    @property
    def idempotency_key(self) -> str:
        """A stable key for calls to outside systems (payment APIs, e-mail providers).

        The same for every attempt and replay of this message in this consumer, at most 70
        ASCII characters, so it fits the idempotency-key limits of common APIs.
        """
        digest = hashlib.sha256(f"{self.consumer}\x00{self.message_id}".encode()).hexdigest()
        return f"inbox-{digest}"

    @property
    def is_rerun(self) -> bool:
        """Whether this run re-runs a message that had completed (an operator's forced re-run
        or rebuild). ``False`` on a message's first run and on replays of rows that never
        completed. A re-run that fails and is replayed again is still a re-run: the message
        completed once, and its outside effects happened then.
        """
        return bool(self.rerun)

    @property
    def errors(self) -> list[dict[str, Any]]:
        """The error entries of :attr:`history`, one per failed attempt."""
        return [entry for entry in self.history if entry.get("kind") == "error"]


class InboxKey(models.Model):
    """The last applied sequence of one key of an ordered consumer.

    Written in the handler's transaction, and locked (``SELECT … FOR UPDATE``) by every
    decision about the key's messages (run, skip, wait), so two messages of one key never
    run at the same time and each decision sees the one before it.
    """

    consumer = models.CharField(max_length=100)
    key = models.CharField(max_length=255)
    applied_sequence = models.BigIntegerField(
        help_text=_("The highest sequence of this key whose message completed (or was skipped).")
    )
    rerun_through = models.BigIntegerField(
        null=True,
        blank=True,
        help_text=_(
            "The applied sequence a re-run rewound: until the key is back there, a new copy of "
            "a version up to it is stale, and later versions wait for the re-run."
        ),
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = _("inbox key")
        verbose_name_plural = _("inbox keys")
        constraints = [
            models.UniqueConstraint(fields=["consumer", "key"], name="django_inbox_unique_key"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer}:{self.key} @ {self.applied_sequence}"


class InboxTombstone(models.Model):
    """What is left of a completed message once ``inbox_purge`` deleted its row: its identity
    (a digest of ``(consumer, message_id)``, :func:`django_inbox.db.tombstones.digest`) and
    two dates, kept until ``expires_at`` (``INBOX_TOMBSTONE_RETENTION`` after the purge).

    A copy of the message that arrives meanwhile is stored ``parked`` with the dates in its
    reason instead of running again (:mod:`django_inbox.db.tombstones`).
    """

    digest = models.UUIDField(primary_key=True)
    completed_at = models.DateTimeField(null=True)
    purged_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    class Meta:
        verbose_name = _("inbox tombstone")
        verbose_name_plural = _("inbox tombstones")

    def __str__(self) -> str:
        return f"{self.digest} (purged {self.purged_at:%Y-%m-%d})"
