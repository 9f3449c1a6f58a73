"""Indexes for MySQL and MariaDB, which ignore the conditions of partial indexes: the
columns each partial index has there instead (``status`` first), and the indexes only they
need. Used by the migrations that build them (the inbox's ``0014``, the outbox's ``0003``);
Django's migration state keeps the portable definitions, so a later ``RemoveIndex`` of one of
them drops it by name on every database."""

from __future__ import annotations

from typing import Any

#: Per index name: its columns on MySQL and MariaDB, and ``None`` where Django's definition
#: is kept; ``True`` in the third place for an index that exists there only.
Layout = dict[str, tuple[tuple[str, ...], tuple[str, ...] | None, bool]]

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
    "django_inbox_finished_idx": (("status", "consumer", "processed_at"), None, True),
}

#: The outbox's table.
OUTBOX: Layout = {
    "django_outbox_pending_idx": (
        ("status", "next_attempt_at", "id"),
        ("next_attempt_at", "id"),
        False,
    ),
    "django_outbox_key_idx": (("status", "key", "id"), ("key", "id"), False),
    "django_outbox_dead_idx": (("status", "updated_at"), ("updated_at",), False),
    "django_outbox_sent_idx": (("status", "sent_at"), ("sent_at",), False),
}


def _alter(schema_editor: Any, model: Any, clauses: list[str]) -> None:
    if schema_editor.connection.vendor != "mysql" or not clauses:
        return
    table = schema_editor.quote_name(model._meta.db_table)
    schema_editor.execute(f"ALTER TABLE {table} {', '.join(clauses)}")


def _columns(schema_editor: Any, columns: tuple[str, ...]) -> str:
    return ", ".join(schema_editor.quote_name(column) for column in columns)


def rebuild(schema_editor: Any, model: Any, layout: Layout) -> None:
    """Give each index of ``layout`` its MySQL columns (one ``ALTER TABLE``)."""
    clauses = []
    for name, (columns, _django, only_here) in layout.items():
        if not only_here:
            clauses.append(f"DROP INDEX {schema_editor.quote_name(name)}")
        clauses.append(
            f"ADD INDEX {schema_editor.quote_name(name)} ({_columns(schema_editor, columns)})"
        )
    _alter(schema_editor, model, clauses)


def restore(schema_editor: Any, model: Any, layout: Layout) -> None:
    """Django's definitions back, and the indexes of MySQL's own dropped."""
    clauses = []
    for name, (_columns_here, django, only_here) in layout.items():
        clauses.append(f"DROP INDEX {schema_editor.quote_name(name)}")
        if not only_here and django is not None:
            clauses.append(
                f"ADD INDEX {schema_editor.quote_name(name)} ({_columns(schema_editor, django)})"
            )
    _alter(schema_editor, model, clauses)
