"""The rows workers hold (``in_progress``), by lease id, built ``CONCURRENTLY`` on PostgreSQL so
that a large table keeps taking messages meanwhile: ``inbox_reclaim``'s look for expired leases
and a take-over's look for the rest of a dead worker's batch read it instead of the table.
"""

from django.db import migrations, models

from django_inbox.db.operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_inbox", "0007_rerun"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("status", "in_progress")),
                fields=["lease_id"],
                name="django_inbox_in_progress_idx",
            ),
        ),
    ]
