"""Indexes for MySQL and MariaDB, which ignore the conditions of partial indexes: a migration
gives each partial index other columns there (``status`` first) and adds the indexes only they
need. The layouts live in the migrations that apply them (the inbox's ``0014``, the outbox's
``0003``), so that a migration keeps doing what it did; this module only applies one.

Django's migration state keeps the portable definitions, so a later ``RemoveIndex`` of one of
them drops it by name on every database; a later ``AddIndex``, ``AlterIndex`` or
``RenameIndex`` of one of them must give MySQL its layout again (the models say so next to
their indexes), and the indexes that exist there only are unknown to ``makemigrations``: no
index of the models may take their names."""

from __future__ import annotations

from typing import Any

#: Per index name: its columns on MySQL and MariaDB; Django's columns, which going back
#: restores (``None`` for an index that exists there only); and whether it exists there only.
Layout = dict[str, tuple[tuple[str, ...], tuple[str, ...] | None, bool]]


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
