"""A BRIN index on ``received_at`` (PostgreSQL only), for time filters on large tables.

Rows arrive in ``received_at`` order, so a BRIN index (a few kB per million rows, nearly free
to maintain on insert) lets "received in the last hour" read only the newest blocks instead
of the whole table. Built ``CONCURRENTLY``; other databases get nothing.
"""

from django.db import migrations

INDEX = "django_inbox_received_brin"


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)
    with schema_editor.connection.cursor() as cursor:
        # An interrupted CONCURRENTLY build leaves an INVALID index behind; IF NOT EXISTS would
        # keep it. Drop it and build again.
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [INDEX],
        )
        found = cursor.fetchone()
    if found and found[0]:
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
    schema_editor.execute(
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} ON {table} USING brin (received_at)"
    )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("django_inbox", "0003_admin_permissions"),
    ]

    operations = [migrations.RunPython(create, drop, elidable=False)]
