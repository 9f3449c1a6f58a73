"""On MySQL and MariaDB, the outbox's partial indexes with ``status`` first: those databases
ignore their conditions, so sent rows (nearly all of the table) filled every one of them, and
a relay's claim read past them. See ``django_inbox``'s ``0014``."""

from typing import Any

from django.db import migrations

from django_inbox.db.mysql_indexes import Layout, rebuild, restore

#: The outbox's table: (columns there, Django's columns to restore, there only).
OUTBOX: Layout = {
    "django_outbox_pending_idx": (
        ("status", "next_attempt_at", "id"),
        ("next_attempt_at", "id"),
        False,
    ),
    "django_outbox_key_idx": (("status", "key", "id"), ("key", "id"), False),
    "django_outbox_dead_idx": (("status", "updated_at"), ("updated_at",), False),
    "django_outbox_sent_idx": (("status", "sent_at"), ("sent_at",), False),
}


def forwards(apps: Any, schema_editor: Any) -> None:
    rebuild(schema_editor, apps.get_model("django_inbox_outbox", "OutboxMessage"), OUTBOX)


def backwards(apps: Any, schema_editor: Any) -> None:
    restore(schema_editor, apps.get_model("django_inbox_outbox", "OutboxMessage"), OUTBOX)


class Migration(migrations.Migration):
    #: DDL: MySQL and MariaDB cannot roll it back, so it runs outside a transaction.
    atomic = False

    dependencies = [
        ("django_inbox_outbox", "0002_exact_identities"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
