"""Exact comparison of names on MySQL and MariaDB: a binary collation without padding.

What ``django_inbox.migrations.0013_exact_identities`` (and the outbox's ``0002``) apply.
Elsewhere nothing is done: PostgreSQL and SQLite compare text exactly.
"""

from __future__ import annotations

from typing import Any

#: Binary collations that do not pad, by preference: MariaDB's, then MySQL 8's. A ``_bin``
#: collation that pads (``utf8mb4_bin``) would still hold ``evt-2`` and ``evt-2 `` equal.
EXACT = ("{charset}_nopad_bin", "{charset}_0900_bin", "{charset}_bin")


def exact_collation(cursor: Any, charset: str) -> str:
    """The first collation of :data:`EXACT` the server has for ``charset``."""
    for pattern in EXACT:
        name = pattern.format(charset=charset)
        cursor.execute("SHOW COLLATION WHERE Collation = %s", [name])
        if cursor.fetchone():
            return name
    raise RuntimeError(f"the server has no binary collation for {charset!r}")


def _alter(schema_editor: Any, model: Any, columns: dict[str, int], collation_of: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    quote = connection.ops.quote_name
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COLUMN_NAME, CHARACTER_SET_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            [table],
        )
        charsets = dict(cursor.fetchall())
        cursor.execute(
            "SELECT TABLE_COLLATION FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = %s",
            [table],
        )
        (default,) = cursor.fetchone()
        changes = []
        for column, length in columns.items():
            charset = charsets[column]
            collation = collation_of(cursor, charset, default)
            changes.append(
                f"MODIFY {quote(column)} varchar({length}) CHARACTER SET {charset} "
                f"COLLATE {collation} NOT NULL"
            )
    schema_editor.execute(f"ALTER TABLE {quote(table)} {', '.join(changes)}")


def exact_columns(schema_editor: Any, model: Any, columns: dict[str, int]) -> None:
    """Give ``columns`` of ``model`` a binary collation without padding (MySQL, MariaDB)."""
    _alter(
        schema_editor, model, columns, lambda cursor, charset, _: exact_collation(cursor, charset)
    )


def restore_columns(schema_editor: Any, model: Any, columns: dict[str, int]) -> None:
    """Give ``columns`` the table's default collation back (reversing :func:`exact_columns`)."""

    def default_of(cursor: Any, charset: str, default: str) -> str:
        if default.startswith(charset + "_"):
            return default
        cursor.execute(
            "SELECT DEFAULT_COLLATE_NAME FROM information_schema.CHARACTER_SETS "
            "WHERE CHARACTER_SET_NAME = %s",
            [charset],
        )
        return str(cursor.fetchone()[0])

    _alter(schema_editor, model, columns, default_of)
