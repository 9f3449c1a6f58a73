"""PostgreSQL: drop the unique constraint on ``(consumer, message_id)``, which 0010's digest
index ``django_inbox_identity_idx`` enforces in half the space.

The model still declares the constraint: uniqueness of the pair holds on every database, and
other databases keep enforcing it with the constraint itself. Code of releases before 0010
names the constraint in its inserts (``ON CONFLICT (consumer, message_id)``) and fails
without it: stop such workers before this migration runs (docs/how-to/upgrading.md).
Reversing it adds the constraint back (building its index under a lock on the table).
"""

from django.db import migrations

CONSTRAINT = "django_inbox_unique_consumer_message"


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)
    schema_editor.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {CONSTRAINT}")


def restore(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)
    schema_editor.execute(
        f'ALTER TABLE {table} ADD CONSTRAINT {CONSTRAINT} UNIQUE ("consumer", "message_id")'
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_inbox", "0010_identity_index"),
    ]

    operations = [migrations.RunPython(drop, restore, elidable=False)]
