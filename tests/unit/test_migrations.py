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
    """0007 adds ``rerun`` while old workers may still insert rows without naming it."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL keeps the column's default")
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO "{table}" (consumer, message_id, source, event_type, key, payload, '
            "headers, status, attempts, last_error, history, received_at, updated_at, lease_id) "
            "VALUES ('old', 'm1', '', 't', '', '{}', '{}', 'received', 0, '', '[]', now(), now(), "
            "'') RETURNING rerun"
        )
        assert cursor.fetchone() == (False,)
