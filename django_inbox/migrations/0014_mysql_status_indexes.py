"""On MySQL and MariaDB, indexes led by ``status``: they ignore the conditions of partial
indexes (Django's ``models.W037``), so the indexes that PostgreSQL and SQLite keep for a few
statuses hold every row there, and the statements that select by status read the whole table.

Each partial index whose condition is on ``status`` is rebuilt there under its own name with
``status`` first, so that a status and a consumer find their rows by a range: the waiting
index serves every "rows of this status (and consumer)" read (the worker's look for waiting
rows, the counts of ``inbox_stats``, the health view and the admin, the expired gaps), the
attention indexes the dead and parked rows (by age, and in primary-key order for the batches of
``inbox_replay`` and ``inbox_purge``, and the admin's list by status). The claim's index stays
as Django made it: finished rows have no due time, so its range of due times reads due rows
only. One more index, ``django_inbox_finished_idx``, finds the completed and skipped rows past
their retention for ``inbox_purge`` (PostgreSQL reads them from its BRIN index of
``received_at`` and the primary key). ``bench/databases.py`` explains every statement at a
million rows. Other databases: nothing.
"""

from django.db import migrations

from django_inbox.db.mysql_indexes import Layout, rebuild, restore

#: The inbox's table: (columns there, Django's columns to restore, there only).
INBOX: Layout = {
    "django_inbox_waiting_idx": (
        ("status", "consumer", "next_attempt_at"),
        ("consumer", "next_attempt_at"),
        False,
    ),
    "django_inbox_attention_idx": (
        ("status", "consumer", "updated_at"),
        ("consumer", "updated_at"),
        False,
    ),
    "django_inbox_attention_id_idx": (("status", "id"), ("id",), False),
    "django_inbox_finished_idx": (("status", "processed_at", "consumer"), None, True),
}


def forwards(apps, schema_editor):
    rebuild(schema_editor, apps.get_model("django_inbox", "InboxMessage"), INBOX)


def backwards(apps, schema_editor):
    restore(schema_editor, apps.get_model("django_inbox", "InboxMessage"), INBOX)


class Migration(migrations.Migration):
    atomic = False  # DDL: MySQL and MariaDB cannot roll it back

    dependencies = [
        ("django_inbox", "0013_exact_identities"),
    ]

    operations = [migrations.RunPython(forwards, backwards, elidable=False)]
