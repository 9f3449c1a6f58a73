"""``InboxMessage.skip_requested`` and ``InboxKey.rerun_through``: an operator's skip of a
version and a re-run's rewind recorded as state (before, a skip was read from the row's last
history entry, and a version arriving during a re-run was judged against the rewound sequence).

Adding a column with a constant default (or none) changes no row on PostgreSQL (11+) and MySQL
(8.0.12+). ``skip_requested`` keeps its database default (``false``) so that processes still
running the previous release, whose inserts do not name it, keep working during a rollout.

Going back keeps both columns: reversing this migration changes only Django's record of the
models. This release's processes name the columns in every statement, and the upgrading
how-to's "going back" (``migrate django_inbox 0010`` while they still run) must not pull them
out from under them; processes of earlier releases ignore them. Applied again, it adds only the
columns that are missing.

The data step marks the versions not completed whose last operator action was a skip.
"""

from django.db import migrations, models

#: History entries of operator actions: the last one says what the operator decided last.
ACTIONS = ("skip", "replay", "park", "retry")

SKIP_REQUESTED = models.BooleanField(
    default=False,
    help_text=(
        "An operator skipped this version of an ordered consumer: it never runs, and is "
        "skipped (counting as applied) when its key reaches it."
    ),
)
RERUN_THROUGH = models.BigIntegerField(
    blank=True,
    null=True,
    help_text=(
        "The applied sequence a re-run rewound: until the key is back there, a new copy of a "
        "version up to it is stale, and later versions wait for the re-run."
    ),
)


def add_missing_columns(apps, schema_editor):
    connection = schema_editor.connection
    quote = connection.ops.quote_name
    for model_name, name, template in (
        ("InboxMessage", "skip_requested", SKIP_REQUESTED),
        ("InboxKey", "rerun_through", RERUN_THROUGH),
    ):
        model = apps.get_model("django_inbox", model_name)
        table = model._meta.db_table
        with connection.cursor() as cursor:
            columns = {
                c.name for c in connection.introspection.get_table_description(cursor, table)
            }
        if name in columns:
            continue  # kept by a reverse of this migration
        field = template.clone()
        field.set_attributes_from_name(name)
        field.model = model
        schema_editor.add_field(model, field)
        if name == "skip_requested" and connection.vendor in ("postgresql", "mysql"):
            schema_editor.execute(
                f"ALTER TABLE {quote(table)} ALTER COLUMN {quote(name)} SET DEFAULT false"
            )


def mark_skips(apps, schema_editor):
    message = apps.get_model("django_inbox", "InboxMessage")
    using = schema_editor.connection.alias
    # Every version not completed whose last operator action was a skip (a skip ahead may
    # have been released, parked for a gap, or failed to be recorded), read only where the
    # history names a skip at all.
    rows = (
        message.objects.using(using)
        .filter(sequence__isnull=False, history__icontains="skip")
        .exclude(status="completed")
    )
    marked = []
    for pk, stored in rows.values_list("pk", "history").iterator():
        entries = stored if isinstance(stored, list) else []
        actions = [e.get("kind") for e in entries if isinstance(e, dict)]
        actions = [kind for kind in actions if kind in ACTIONS]
        if actions and actions[-1] == "skip":
            marked.append(pk)
    for start in range(0, len(marked), 1000):
        message.objects.using(using).filter(pk__in=marked[start : start + 1000]).update(
            skip_requested=True
        )


class Migration(migrations.Migration):
    dependencies = [
        ("django_inbox", "0011_drop_pair_constraint"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="inboxmessage", name="skip_requested", field=SKIP_REQUESTED
                ),
                migrations.AddField(
                    model_name="inboxkey", name="rerun_through", field=RERUN_THROUGH
                ),
            ],
            database_operations=[
                # Outside the migration's transaction on MySQL, which cannot roll DDL back
                # (Django refuses DDL inside a transaction there).
                migrations.RunPython(add_missing_columns, migrations.RunPython.noop, atomic=False),
            ],
        ),
        migrations.RunPython(mark_skips, migrations.RunPython.noop, elidable=True),
    ]
