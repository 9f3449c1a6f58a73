"""PostgreSQL: the unique index of message identities by digest, and an index of consumers.

``django_inbox_identity_idx`` is unique on a 16-byte digest of ``(consumer, message_id)``
(:mod:`django_inbox.db.identity`): 28 bytes per entry where the unique constraint on the two
columns takes 56 or more, so the index every delivery probes is about half the size and stays
in memory at twice the rows. ``django_inbox_consumer_idx`` indexes ``consumer`` alone (in the
``"C"`` collation, so that only statements that ask for it use it), a few bytes per row
(PostgreSQL stores a repeated key once): it lists consumers by a loose index scan and counts one
consumer's rows, as the leading column of the unique constraint did.

Both are built ``CONCURRENTLY``, so a large table keeps taking messages meanwhile. The unique
constraint on ``(consumer, message_id)`` stays until 0011 drops it: code of the previous
release, which names it in its inserts, keeps working until then. Other databases keep the
constraint and get nothing here.
"""

from django.db import migrations

from django_inbox.db.identity import CONSUMER_INDEX, CONSUMER_SQL, INDEX, digest_sql


def _build(schema_editor, name, definition):
    with schema_editor.connection.cursor() as cursor:
        # An interrupted CONCURRENTLY build leaves an INVALID index behind; IF NOT EXISTS would
        # keep it. Drop it and build again.
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [name],
        )
        found = cursor.fetchone()
    if found and found[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    schema_editor.execute(definition)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)
    digest = digest_sql('"consumer"', '"message_id"')
    _build(
        schema_editor,
        INDEX,
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {table} (({digest}))",
    )
    _build(
        schema_editor,
        CONSUMER_INDEX,
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {CONSUMER_INDEX} ON {table} ({CONSUMER_SQL})",
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {CONSUMER_INDEX}")
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_inbox", "0009_attention_id_index"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
