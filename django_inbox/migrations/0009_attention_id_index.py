"""Dead and parked rows in primary-key order, built ``CONCURRENTLY`` on PostgreSQL so that a
large table keeps taking messages meanwhile: the batches of ``inbox_replay`` and of
``inbox_purge``'s dead rows read their own rows through it.
"""

from django.db import migrations, models

from django_inbox.db.operations import AddIndexConcurrently


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_inbox", "0008_in_progress_index"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("status__in", ("dead", "parked"))),
                fields=["id"],
                name="django_inbox_attention_id_idx",
            ),
        ),
    ]
