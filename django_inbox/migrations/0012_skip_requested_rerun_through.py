"""``InboxMessage.skip_requested`` and ``InboxKey.rerun_through``: an operator's skip of a
version and a re-run's rewind recorded as state (before, a skip was read from the row's last
history entry, and a version arriving during a re-run was judged against the rewound sequence).

Adding a column with a constant default (or none) changes no row on PostgreSQL (11+) and MySQL
(8.0.12+). ``skip_requested`` keeps its database default (``false``) so that processes still
running the previous release, whose inserts do not name it, keep working during a rollout. The
data step marks the versions not completed whose last operator action was a skip.
"""

from django.db import migrations, models

#: History entries of operator actions: the last one says what the operator decided last.
ACTIONS = ("skip", "replay", "park", "retry")


def keep_default(apps, schema_editor):
    connection = schema_editor.connection
    if connection.vendor not in ("postgresql", "mysql"):
        return
    quote = connection.ops.quote_name
    table = apps.get_model("django_inbox", "InboxMessage")._meta.db_table
    schema_editor.execute(
        f"ALTER TABLE {quote(table)} ALTER COLUMN {quote('skip_requested')} SET DEFAULT false"
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
        migrations.AddField(
            model_name="inboxmessage",
            name="skip_requested",
            field=models.BooleanField(
                default=False,
                help_text=(
                    "An operator skipped this version of an ordered consumer: it never runs, "
                    "and is skipped (counting as applied) when its key reaches it."
                ),
            ),
        ),
        migrations.AddField(
            model_name="inboxkey",
            name="rerun_through",
            field=models.BigIntegerField(
                blank=True,
                null=True,
                help_text=(
                    "The applied sequence a re-run rewound: until the key is back there, a new "
                    "copy of a version up to it is stale, and later versions wait for the "
                    "re-run."
                ),
            ),
        ),
        # Outside the migration's transaction: MySQL cannot roll DDL back, and Django refuses
        # DDL inside a transaction there.
        migrations.RunPython(keep_default, migrations.RunPython.noop, atomic=False, elidable=True),
        migrations.RunPython(mark_skips, migrations.RunPython.noop, elidable=True),
    ]
