"""Ordered consumers' indexes, built ``CONCURRENTLY`` on PostgreSQL so that a large table keeps
taking messages meanwhile. Existing rows have no sequence and none waits, so both start empty:

- ``django_inbox_sequence_idx``: a key's versions, ``(consumer, key, sequence)`` over the rows
  that have a sequence (stale checks, the next waiting version, the admin's key view);
- ``django_inbox_waiting_idx``: ``waiting`` rows by gap deadline, ``(consumer,
  next_attempt_at)`` (the sweep for expired gaps, the stats' waiting age).
"""

from django.db import migrations, models

from django_inbox.db.operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_inbox", "0005_ordered_consumers"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("sequence__isnull", False)),
                fields=["consumer", "key", "sequence"],
                name="django_inbox_sequence_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("status", "waiting")),
                fields=["consumer", "next_attempt_at"],
                name="django_inbox_waiting_idx",
            ),
        ),
    ]
