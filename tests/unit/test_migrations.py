"""The shipped migrations match the models, whatever the project's DEFAULT_AUTO_FIELD."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.db import models
from django.test import override_settings

from django_inbox.models import InboxMessage

pytestmark = pytest.mark.django_db


def makemigrations(*args: str) -> str:
    out = StringIO()
    try:
        call_command("makemigrations", *args, "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits 1 when a migration is missing
        pytest.fail(f"makemigrations found changes (exit {exc.code}):\n{out.getvalue()}")
    return out.getvalue()


def test_no_missing_migrations() -> None:
    assert "No changes detected" in makemigrations()


def test_no_missing_migrations_for_the_inbox() -> None:
    assert "No changes detected in app 'django_inbox'" in makemigrations("django_inbox")


@override_settings(DEFAULT_AUTO_FIELD="django.db.models.AutoField")
def test_no_migration_when_the_project_uses_autofield() -> None:
    assert "No changes detected in app 'django_inbox'" in makemigrations("django_inbox")


def test_primary_key_is_declared_explicitly() -> None:
    # An explicit BigAutoField does not depend on DEFAULT_AUTO_FIELD or the app config, so no
    # project setting can ever make Django want a migration for it.
    pk = InboxMessage._meta.pk
    assert isinstance(pk, models.BigAutoField)
    assert pk.auto_created is False


@pytest.mark.postgres
def test_the_rerun_column_keeps_a_default_for_the_previous_releases_inserts() -> None:
    """0007 adds ``rerun`` (and 0012 ``skip_requested``) while old workers may still insert
    rows without naming it."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL keeps the column's default")
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" (consumer, message_id, source, event_type, key, payload, '
            "headers, status, attempts, last_error, history, received_at, updated_at, lease_id) "
            "VALUES ('old', 'm1', '', 't', '', '{}', '{}', 'received', 0, '', '[]', now(), now(), "
            "'') RETURNING rerun, skip_requested"
        )
        assert cursor.fetchone() == (False, False)  # 0012's column too


@pytest.mark.django_db(transaction=True)
def test_going_back_past_0012_keeps_its_columns_for_the_processes_still_running() -> None:
    """The upgrading how-to goes back to 0010 while this release's processes run: they name
    0012's columns in every statement, so its reverse keeps them; applied again, it adds
    nothing and the inbox works."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    from django_inbox import store
    from django_inbox.models import InboxKey

    def columns(model: type) -> set[str]:
        with connection.cursor() as cursor:
            found = connection.introspection.get_table_description(cursor, model._meta.db_table)
        return {column.name for column in found}

    executor = MigrationExecutor(connection)
    executor.migrate([("django_inbox", "0011_drop_pair_constraint")])
    try:
        assert "skip_requested" in columns(InboxMessage)
        assert "rerun_through" in columns(InboxKey)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert store(consumer="effects", message_id="back", event_type="effect.write", payload={})
    assert InboxMessage.objects.get(message_id="back").skip_requested is False
