"""``InboxMessage.rerun``: set when an operator re-runs a message that had completed.

Adding a column with a constant default changes no row on PostgreSQL (11+) and MySQL (8.0.12+):
it is a change to the table's definition. The column keeps its database default (``false``),
so processes still running the previous release, whose inserts do not name it, keep working
while a deployment rolls out (SQLite cannot change a column's default afterwards, and does not
need to).
"""

from django.db import migrations, models


def keep_default(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor not in ("postgresql", "mysql"):
        return
    quote = connection.ops.quote_name
    table = apps.get_model("django_inbox", "InboxMessage")._meta.db_table
    schema_editor.execute(
        f"ALTER TABLE {quote(table)} ALTER COLUMN {quote('rerun')} SET DEFAULT false"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("django_inbox", "0006_sequence_index"),
    ]

    operations = [
        migrations.AddField(
            model_name="inboxmessage",
            name="rerun",
            field=models.BooleanField(
                default=False,
                help_text=(
                    "An operator re-ran this message after it had completed: its handler runs "
                    "as a re-run (message.is_rerun), and @side_effect calls follow the "
                    "consumer's policy."
                ),
            ),
        ),
        # DDL: outside a transaction on MySQL and MariaDB, which cannot roll DDL back.
        migrations.RunPython(keep_default, migrations.RunPython.noop, elidable=True, atomic=False),
    ]
