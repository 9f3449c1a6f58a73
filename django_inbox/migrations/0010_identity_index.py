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

The SQL is written out here, not imported: a migration builds what it built the day it was
written. ``tests/unit/test_identity.py`` checks that the index PostgreSQL holds is the one the
code's lookups compare (``django_inbox.db.identity.digest_sql``).
"""

from django.db import migrations

INDEX = "django_inbox_identity_idx"
CONSUMER_INDEX = "django_inbox_consumer_idx"
DIGEST = (
    "encode(substring(sha256(replace(length(\"consumer\"::text)::text || ':' || "
    "\"consumer\"::text || \"message_id\"::text, E'\\\\', E'\\\\\\\\')::bytea) FROM 1 FOR 16), "
    "'hex')::uuid"
)
CONSUMER = '("consumer" COLLATE "C")'


def _invalid(schema_editor, name):
    """Whether ``name`` (in the schema the connection resolves it in) is an index left INVALID
    by an interrupted ``CONCURRENTLY`` build."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
            [name],
        )
        found = cursor.fetchone()
    return bool(found and found[0])


def _build(schema_editor, name, definition):
    # An interrupted CONCURRENTLY build leaves an INVALID index behind; IF NOT EXISTS would
    # keep it. Drop it and build again.
    if _invalid(schema_editor, name):
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
    schema_editor.execute(definition)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)
    _build(
        schema_editor,
        INDEX,
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {table} (({DIGEST}))",
    )
    _build(
        schema_editor,
        CONSUMER_INDEX,
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {CONSUMER_INDEX} ON {table} ({CONSUMER})",
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

    operations = [
        migrations.RunPython(create, drop, elidable=False, hints={"model_name": "inboxmessage"})
    ]
