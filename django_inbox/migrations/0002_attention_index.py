from django.db import migrations, models

from django_inbox.db.operations import AddIndexConcurrently


class Migration(migrations.Migration):
    # CREATE INDEX CONCURRENTLY on PostgreSQL: workers keep writing while it is built.
    atomic = False

    dependencies = [
        ("django_inbox", "0001_initial"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="inboxmessage",
            index=models.Index(
                condition=models.Q(("status__in", ("dead", "parked"))),
                fields=["consumer", "updated_at"],
                name="django_inbox_attention_idx",
            ),
        ),
    ]
