"""PostgreSQL: drop the unique constraint on ``(consumer, message_id)``, which 0010's digest
index ``django_inbox_identity_idx`` enforces in half the space.

The model still declares the constraint: uniqueness of the pair holds on every database, and
other databases keep enforcing it with the constraint itself (see the model's ``Meta``). Code of
releases before 0010 names the constraint in its inserts (``ON CONFLICT (consumer,
message_id)``) and fails without it: stop such workers before this migration runs
(docs/howto/upgrading.md).

It refuses to run unless the digest index exists on this table, unique, valid and built on
0010's expression (an interrupted 0010, or a 0010 marked applied with ``--fake``, leaves
none). The ``DROP`` waits at most ``LOCK_TIMEOUT`` for its lock: behind a long transaction the
migration fails (run it again) after queries on the table have waited that long behind it,
instead of for as long as that transaction lasts. The ``DROP`` also removes an index of the
pair's name left without its constraint by an interrupted reverse. Reversing it builds the
pair's index ``CONCURRENTLY`` and then makes it the constraint, so the table keeps being read
and written meanwhile.
"""

import importlib

from django.db import OperationalError, migrations, transaction

CONSTRAINT = "django_inbox_unique_consumer_message"
INDEX = "django_inbox_identity_idx"
LOCK_TIMEOUT = "3s"
_0010 = importlib.import_module("django_inbox.migrations.0010_identity_index")
#: The expression 0010 built the digest index on.
DIGEST = _0010.DIGEST


def _table(apps, schema_editor):
    return schema_editor.quote_name(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)


def _locked_briefly(schema_editor, *statements):
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            for sql in statements:
                schema_editor.execute(sql)
    except OperationalError as exc:
        if getattr(getattr(exc, "__cause__", None), "sqlstate", None) != "55P03":
            raise
        raise RuntimeError(
            f"django_inbox 0011 waited {LOCK_TIMEOUT} for its lock on the inbox table behind "
            "another transaction and gave up, changing nothing: run migrate again (when no "
            "long transaction holds the table)."
        ) from exc


def _digest_index_ok(schema_editor, table):
    """Whether 0010's index is on ``table``: unique, valid, on 0010's expression."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisunique AND i.indisvalid AND i.indisready, "
            "pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "WHERE i.indexrelid = to_regclass(%s) AND i.indrelid = to_regclass(%s)",
            [INDEX, table],
        )
        found = cursor.fetchone()
        if not (found and found[0]):
            return False
        # The definition PostgreSQL prints for 0010's expression, from a scratch copy.
        cursor.execute(f"CREATE TEMP TABLE django_inbox_identity_check (LIKE {table})")
        try:
            cursor.execute(
                "CREATE UNIQUE INDEX django_inbox_identity_check_idx "
                f"ON django_inbox_identity_check (({DIGEST}))"
            )
            cursor.execute("SELECT pg_get_indexdef('django_inbox_identity_check_idx'::regclass)")
            expected = cursor.fetchone()[0]
        finally:
            cursor.execute("DROP TABLE django_inbox_identity_check")
    return found[1].split(" USING ", 1)[-1] == expected.split(" USING ", 1)[-1]


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = _table(apps, schema_editor)
    if not _digest_index_ok(schema_editor, table):
        raise RuntimeError(
            f"{INDEX} is missing, or not a valid unique index of 0010's digest on {table}, so "
            f"dropping {CONSTRAINT} would leave the inbox without deduplication: migrate back "
            "to django_inbox 0009, then forward again (0010 builds the index)."
        )
    _locked_briefly(
        schema_editor,
        f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {CONSTRAINT}",
        f"DROP INDEX IF EXISTS {CONSTRAINT}",
    )


def restore(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = _table(apps, schema_editor)
    _0010._build(  # an INVALID index of that name, left by an interrupted build, is rebuilt
        schema_editor,
        CONSTRAINT,
        f"CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {CONSTRAINT} "
        f'ON {table} ("consumer", "message_id")',
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
