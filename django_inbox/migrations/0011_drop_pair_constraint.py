"""PostgreSQL: drop the unique constraint on ``(consumer, message_id)``, which 0010's digest
index ``django_inbox_identity_idx`` enforces in half the space.

The model still declares the constraint: uniqueness of the pair holds on every database, and
other databases keep enforcing it with the constraint itself (see the model's ``Meta``). Code of
releases before 0010 names the constraint in its inserts (``ON CONFLICT (consumer,
message_id)``) and fails without it: stop such workers before this migration runs
(docs/howto/upgrading.md).

It refuses to run unless the digest index exists on this table, unique and valid (an
interrupted 0010, or a 0010 marked applied with ``--fake``, leaves none). The ``DROP`` waits at
most ``LOCK_TIMEOUT`` for its lock, so that a long transaction makes the migration fail (run it
again) instead of queueing every query on the table behind it. Reversing it builds the pair's
index ``CONCURRENTLY`` and then makes it the constraint, so the table keeps being read and
written meanwhile.
"""

from django.db import migrations, transaction

CONSTRAINT = "django_inbox_unique_consumer_message"
INDEX = "django_inbox_identity_idx"
LOCK_TIMEOUT = "10s"


def _table(apps, schema_editor):
    return schema_editor.quote_name(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)


def _locked_briefly(schema_editor, sql):
    with transaction.atomic(using=schema_editor.connection.alias):
        schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        schema_editor.execute(sql)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = _table(apps, schema_editor)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisunique AND i.indisvalid AND i.indisready FROM pg_index i "
            "WHERE i.indexrelid = to_regclass(%s) AND i.indrelid = to_regclass(%s)",
            [INDEX, table],
        )
        found = cursor.fetchone()
    if not (found and found[0]):
        raise RuntimeError(
            f"{INDEX} is missing or not a valid unique index on {table}, so dropping "
            f"{CONSTRAINT} would leave the inbox without deduplication: migrate back to "
            "django_inbox 0009, then forward again (0010 builds the index)."
        )
    _locked_briefly(schema_editor, f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {CONSTRAINT}")


def restore(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = _table(apps, schema_editor)
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i WHERE i.indexrelid = to_regclass(%s)",
            [CONSTRAINT],
        )
        found = cursor.fetchone()
    if found and found[0]:  # left INVALID by an interrupted build: build it again
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {CONSTRAINT}")
    schema_editor.execute(
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {CONSTRAINT} "
        f'ON {table} ("consumer", "message_id")'
    )
    _locked_briefly(
        schema_editor,
        f"ALTER TABLE {table} ADD CONSTRAINT {CONSTRAINT} UNIQUE USING INDEX {CONSTRAINT}",
    )


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_inbox", "0010_identity_index"),
    ]

    operations = [
        migrations.RunPython(drop, restore, elidable=False, hints={"model_name": "inboxmessage"})
    ]
