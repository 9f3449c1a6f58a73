"""On MySQL and MariaDB, message ids, consumers, keys, sources and event types compare as exact
strings: a binary collation without padding on those columns.

Their default collations (``utf8mb4_general_ci`` on MariaDB, ``utf8mb4_0900_ai_ci`` on MySQL
8) compare case- and accent-insensitively, ignore trailing spaces and hold every emoji equal:
``evt-ABC`` and ``evt-abc`` were one message id there (the second answered as a duplicate and
never run) and ``ORDER-x`` and ``order-x`` one ordered key. PostgreSQL and SQLite compare
exactly already: nothing to do there. The columns keep their character set; the unique
indexes on them are rebuilt by the same ``ALTER TABLE``. Going back restores the table's
default collation.
"""

from django.db import migrations

from django_inbox.db.collation import exact_columns, restore_columns

#: Per model: its text columns that name something, with their lengths.
COLUMNS = {
    "InboxMessage": {
        "consumer": 100,
        "message_id": 255,
        "source": 255,
        "event_type": 255,
        "key": 255,
    },
    "InboxKey": {"consumer": 100, "key": 255},
}


def forwards(apps, schema_editor):
    for model, columns in COLUMNS.items():
        exact_columns(schema_editor, apps.get_model("django_inbox", model), columns)


def backwards(apps, schema_editor):
    for model, columns in COLUMNS.items():
        restore_columns(schema_editor, apps.get_model("django_inbox", model), columns)


class Migration(migrations.Migration):
    #: DDL: MySQL and MariaDB cannot roll it back, so it runs outside a transaction.
    atomic = False

    dependencies = [
        ("django_inbox", "0012_skip_requested_rerun_through"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
