"""The outbox's table: one row per message published in a business transaction."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from ..db.json import StoredJSONField


class OutboxMessage(models.Model):
    class Status(models.TextChoices):
        #: Written by ``publish()``; a relay publishes it (again, after a failed attempt).
        PENDING = "pending", _("pending")
        #: The broker confirmed it.
        SENT = "sent", _("sent")
        #: Not published after its attempts, or refused by the broker: an operator replays it.
        DEAD = "dead", _("dead")

    id = models.BigAutoField(primary_key=True)
    message_id = models.CharField(
        max_length=255, unique=True, help_text=_("The AMQP message_id of every publication.")
    )
    event_type = models.CharField(max_length=255)
    payload = StoredJSONField()
    headers = StoredJSONField(default=dict, blank=True)
    exchange = models.CharField(max_length=255, blank=True, default="")
    routing_key = models.CharField(max_length=255)
    key = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text=_("Rows of one key are published one at a time, in the order written."),
    )
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    #: ``NULL`` on a pending row while an earlier pending row of its key holds it back: the
    #: relay that settles that row makes it due (``held.release``).
    next_attempt_at = models.DateTimeField(
        null=True, blank=True, help_text=_("When a relay may next publish it (pending rows).")
    )
    locked_until = models.DateTimeField(
        null=True, blank=True, help_text=_("A relay's claim on the row runs out then.")
    )
    lease_id = models.CharField(max_length=36, blank=True, default="")
    sent_at = models.DateTimeField(null=True, blank=True)
    #: The inbox message whose handler published it, if any.
    causation_consumer = models.CharField(max_length=100, blank=True, default="")
    causation_message_id = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        verbose_name = _("outbox message")
        verbose_name_plural = _("outbox messages")
        # On MySQL and MariaDB, which ignore their conditions, migration 0003 gives the partial
        # indexes led by a status other columns (``status`` first) and adds indexes of their
        # own (django_inbox/db/mysql_indexes.py): a migration that adds, alters or renames one
        # of them must give MySQL its layout again.
        indexes = [
            # What relays claim: pending rows by due time, then the order they were written.
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(status="pending"),
                name="django_outbox_pending_idx",
            ),
            # A key's pending rows in order: only its oldest may be published.
            models.Index(
                fields=["key", "id"],
                condition=Q(status="pending") & ~Q(key=""),
                name="django_outbox_key_idx",
            ),
            # Dead rows: few, and what operators (and inbox_stats) look for.
            models.Index(
                fields=["updated_at"], condition=Q(status="dead"), name="django_outbox_dead_idx"
            ),
            # Sent rows by age, for the purge.
            models.Index(
                fields=["sent_at"], condition=Q(status="sent"), name="django_outbox_sent_idx"
            ),
        ]
        permissions = [
            ("replay_outboxmessage", "Can replay dead outbox messages"),
            ("view_payload_outboxmessage", "Can see outbox message payloads and headers"),
        ]

    def __str__(self) -> str:
        return f"{self.event_type}:{self.message_id} ({self.status})"
