"""On MySQL and MariaDB, an outbox row's message id and key compare as exact strings (a binary
collation without padding): under the default collations ``ORDER-x`` and ``order-x`` were one
key, their rows published one behind the other. See ``django_inbox``'s ``0013``."""

from typing import Any

from django.db import migrations

from django_inbox.db.collation import exact_columns, restore_columns

COLUMNS = {"message_id": 255, "key": 255}


def forwards(apps: Any, schema_editor: Any) -> None:
    exact_columns(schema_editor, apps.get_model("django_inbox_outbox", "OutboxMessage"), COLUMNS)


def backwards(apps: Any, schema_editor: Any) -> None:
    restore_columns(schema_editor, apps.get_model("django_inbox_outbox", "OutboxMessage"), COLUMNS)


class Migration(migrations.Migration):
    #: DDL: MySQL and MariaDB cannot roll it back, so it runs outside a transaction.
    atomic = False

    dependencies = [
        ("django_inbox_outbox", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
