"""The index of ordered consumers' versions, ``(consumer, key, sequence)`` over the rows that
have a sequence. On PostgreSQL it is built ``CONCURRENTLY``, so a large table keeps taking
messages meanwhile; existing rows have no sequence, so the index starts empty."""

from django.db import migrations, models

INDEX = models.Index(
    fields=["consumer", "key", "sequence"],
    condition=models.Q(sequence__isnull=False),
    name="django_inbox_sequence_idx",
)


def create(apps, schema_editor):
    model = apps.get_model("django_inbox", "InboxMessage")
    if schema_editor.connection.vendor != "postgresql":
        schema_editor.add_index(model, INDEX)
        return
    with schema_editor.connection.cursor() as cursor:
        # An interrupted CONCURRENTLY build leaves an INVALID index behind: build it again.
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [INDEX.name],
        )
        found = cursor.fetchone()
    if found and found[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX.name}")
    if found and not found[0]:
        return
    schema_editor.add_index(model, INDEX, concurrently=True)


def drop(apps, schema_editor):
    model = apps.get_model("django_inbox", "InboxMessage")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.remove_index(model, INDEX, concurrently=True)
    else:
        schema_editor.remove_index(model, INDEX)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_inbox", "0005_ordered_consumers"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(create, drop, elidable=False)],
            state_operations=[migrations.AddIndex(model_name="inboxmessage", index=INDEX)],
        )
    ]
