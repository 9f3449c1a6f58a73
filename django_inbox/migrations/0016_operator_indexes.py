"""Indexes for what operators read in an incident, when a table of millions of rows must not be
read row by row:

- ``django_inbox_failed_idx``: failed rows (``status = 'failed'``) by consumer and due time.
  Failed rows share the polled index with the rows still to process, which holds no status:
  with a backlog of received rows, counting or grouping the few failed ones read the backlog.
- ``django_inbox_key_idx`` and ``django_inbox_source_idx``: the admin's ``key:`` and
  ``source:`` searches. Rows without a key or a source are not in them.

On PostgreSQL, also extended statistics of ``(consumer, status)`` (``CREATE STATISTICS …
(mcv)``): the planner then knows how many rows each consumer has in each status instead of
multiplying the two columns' shares, and the counts that operators' surfaces estimate on a
large table (``inbox_stats``, the health view, the admin) follow a consumer's own backlog.

On PostgreSQL the indexes are built ``CONCURRENTLY``: writes go on while they are built, so the
migration is not atomic; an index left invalid by an interrupted build is built again. MySQL
and MariaDB ignore the conditions of partial indexes (each would hold every row), and their
waiting index (migration 0014) already leads with the status and the consumer: nothing is made
there, and their key and source searches read the table.
"""

from django.db import migrations, models

INDEXES = [
    models.Index(
        fields=["consumer", "next_attempt_at"],
        condition=models.Q(status="failed"),
        name="django_inbox_failed_idx",
    ),
    models.Index(fields=["key"], condition=~models.Q(key=""), name="django_inbox_key_idx"),
    models.Index(fields=["source"], condition=~models.Q(source=""), name="django_inbox_source_idx"),
]


def _invalid(schema_editor, name):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND pg_table_is_visible(c.oid)",
            [name],
        )
        found = cursor.fetchone()
    return bool(found and found[0])


STATISTICS = "django_inbox_consumer_status_stats"


def forwards(apps, schema_editor):
    model = apps.get_model("django_inbox", "InboxMessage")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        return
    if vendor == "postgresql":
        table = schema_editor.quote_name(model._meta.db_table)
        schema_editor.execute(
            f"CREATE STATISTICS IF NOT EXISTS {STATISTICS} (mcv) ON consumer, status FROM {table}"
        )
        # Gathered by ANALYZE only: now (a sample of 30,000 rows, whatever the table's size),
        # not at autovacuum's next pass.
        schema_editor.execute(f"ANALYZE {table}")
    for index in INDEXES:
        if vendor != "postgresql":
            schema_editor.add_index(model, index)
            continue
        name = schema_editor.quote_name(index.name)
        if _invalid(schema_editor, index.name):  # an interrupted build: build it again
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        sql = str(index.create_sql(model, schema_editor, concurrently=True))
        prefix = "CREATE INDEX CONCURRENTLY "
        if not sql.startswith(prefix):
            raise RuntimeError(f"unexpected SQL for {index.name}: {sql}")
        schema_editor.execute(f"{prefix}IF NOT EXISTS {sql[len(prefix) :]}")


def backwards(apps, schema_editor):
    model = apps.get_model("django_inbox", "InboxMessage")
    vendor = schema_editor.connection.vendor
    if vendor == "mysql":
        return
    if vendor == "postgresql":
        schema_editor.execute(f"DROP STATISTICS IF EXISTS {STATISTICS}")
    for index in INDEXES:
        if vendor == "postgresql":
            name = schema_editor.quote_name(index.name)
            schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        else:
            schema_editor.remove_index(model, index)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run in a transaction

    dependencies = [
        ("django_inbox", "0015_tombstones"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(model_name="inboxmessage", index=index.clone())
                for index in INDEXES
            ],
            database_operations=[migrations.RunPython(forwards, backwards, elidable=False)],
        ),
    ]
