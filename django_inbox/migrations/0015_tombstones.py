"""Tombstones of purged completed messages (``django_inbox.db.tombstones``).

The table holds a 16-byte digest of ``(consumer, message_id)`` and three dates per purged
message, with a B-tree index on ``expires_at`` for ``inbox_purge``'s expiry (not a BRIN index:
consumers' retentions differ, renewed tombstones move, and freed pages are reused, so the
pages' ranges of expiry dates would soon all overlap).

On PostgreSQL a ``BEFORE INSERT`` trigger on the inbox's table parks a late copy: a row that
would run (``received``, ``in_progress``, ``completed``, ``failed``, ``waiting``) whose pair has a
tombstone goes in ``parked``. One statement looks for the tombstone and the pair's row; a new
message (neither there) costs nothing more: a purge that deleted its row committed before that
look, tombstone included. Where the row is there (a duplicate), a purge may be deleting it
right now: the trigger takes a shared advisory lock that every purge of completed rows holds
exclusively until it commits, so it waits for such a purge (or makes a later one wait), and
looks for the tombstone again. An advisory lock lives in memory: a duplicate's transaction
stays read-only, and no row lock hides the row from workers' ``SKIP LOCKED`` claims. The inbox writes the reason after the
insert. Other databases: the inbox reads the tombstone after its insert.

The function runs with ``enable_seqscan = off``: PL/pgSQL keeps a plan for the session (until
the table's statistics change), and one made while the table was small (a new deployment, a bulk load in one statement) would
read the table whole for every insert after it; with it off, both looks are index probes
whatever the statistics said when the plan was made.

The SQL is written out here, not imported: a migration builds what it built the day it was
written. ``tests/unit/test_tombstones.py`` checks that the trigger's digest function computes what
``django_inbox.db.tombstones.digest`` does.
"""

from django.db import migrations, models

TRIGGER = "django_inbox_late_copy"
INDEX = "django_inbox_tombstone_expires_idx"
DIGEST_FUNCTION = "django_inbox_tombstone_digest"
#: The advisory lock a purge of completed rows holds (django_inbox.db.tombstones.PURGE_LOCK,
#: written out here: the bytes of "dj_inbox").
PURGE_LOCK = 7235700657752272760


def _bytes(consumer, message_id):
    """The first 16 bytes of the identity's SHA-256 (as migration 0010's index takes them)."""
    text = f"length({consumer}::text)::text || ':' || {consumer}::text || {message_id}::text"
    return f"substring(sha256(replace({text}, E'\\\\', E'\\\\\\\\')::bytea) FROM 1 FOR 16)"


def _identity(consumer, message_id):
    """The expression of migration 0010's unique index of identities."""
    return f"encode({_bytes(consumer, message_id)}, 'hex')::uuid"


def create(apps, schema_editor):
    quote = schema_editor.quote_name
    tombstones = quote(apps.get_model("django_inbox", "InboxTombstone")._meta.db_table)
    schema_editor.execute(f"CREATE INDEX {INDEX} ON {tombstones} ({quote('expires_at')})")
    if schema_editor.connection.vendor != "postgresql":
        return
    inbox = quote(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)
    # The identity's 16 bytes with the version and variant bits of a UUID of version 4 (as
    # django_inbox.db.tombstones.digest sets them: MariaDB's uuid type wants them).
    schema_editor.execute(
        f"""
CREATE OR REPLACE FUNCTION {DIGEST_FUNCTION}(consumer text, message_id text) RETURNS uuid
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $body$
DECLARE
    raw bytea := {_bytes("consumer", "message_id")};
BEGIN
    raw := set_byte(raw, 6, (get_byte(raw, 6) & 15) | 64);
    raw := set_byte(raw, 8, (get_byte(raw, 8) & 63) | 128);
    RETURN encode(raw, 'hex')::uuid;
END
$body$
"""
    )
    schema_editor.execute(
        f"""
CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off AS $body$
DECLARE
    raw bytea := {_bytes("NEW.consumer", "NEW.message_id")};
    identity uuid := encode(raw, 'hex')::uuid;
    stone uuid := encode(set_byte(set_byte(raw, 6, (get_byte(raw, 6) & 15) | 64), 8,
        (get_byte(raw, 8) & 63) | 128), 'hex')::uuid;
    kept boolean;
    present boolean;
BEGIN
    SELECT EXISTS (SELECT 1 FROM {tombstones} WHERE digest = stone),
        EXISTS (SELECT 1 FROM {inbox} WHERE {_identity('"consumer"', '"message_id"')} = identity)
        INTO kept, present;
    IF present AND NOT kept THEN
        -- The pair's row is there: a purge may be deleting it now. Wait for any purge of
        -- completed rows in progress (each holds this lock exclusively until it commits; one
        -- that comes later waits for this transaction instead), then look again: a new
        -- snapshot, which holds the tombstone such a purge committed. An advisory lock, in
        -- memory: the duplicate's transaction writes nothing.
        PERFORM pg_advisory_xact_lock_shared({PURGE_LOCK});
        kept := EXISTS (SELECT 1 FROM {tombstones} WHERE digest = stone);
    END IF;
    IF kept THEN
        NEW.status := 'parked';
        NEW.attempts := 0;
        NEW.next_attempt_at := NULL;
        NEW.locked_until := NULL;
        NEW.lease_id := '';
        NEW.processed_at := NULL;
    END IF;
    RETURN NEW;
END
$body$
"""
    )
    schema_editor.execute(
        f"CREATE TRIGGER {TRIGGER} BEFORE INSERT ON {inbox} FOR EACH ROW "
        "WHEN (NEW.status IN ('received', 'in_progress', 'completed', 'failed', 'waiting')) "
        f"EXECUTE FUNCTION {TRIGGER}()"
    )


def drop(apps, schema_editor):
    quote = schema_editor.quote_name
    if schema_editor.connection.vendor == "postgresql":
        inbox = quote(apps.get_model("django_inbox", "InboxMessage")._meta.db_table)
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {TRIGGER} ON {inbox}")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {TRIGGER}()")
        schema_editor.execute(f"DROP FUNCTION IF EXISTS {DIGEST_FUNCTION}(text, text)")
    # The index goes with the table (the operation before this one, reversed after it).


class Migration(migrations.Migration):
    atomic = False  # DDL: MySQL and MariaDB cannot roll it back

    dependencies = [
        ("django_inbox", "0014_mysql_status_indexes"),
    ]

    operations = [
        migrations.CreateModel(
            name="InboxTombstone",
            fields=[
                ("digest", models.UUIDField(primary_key=True, serialize=False)),
                ("completed_at", models.DateTimeField(null=True)),
                ("purged_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
            ],
            options={
                "verbose_name": "inbox tombstone",
                "verbose_name_plural": "inbox tombstones",
            },
        ),
        migrations.RunPython(create, drop, elidable=False),
    ]
