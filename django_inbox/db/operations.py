"""Migration operations of the inbox's own migrations."""

from __future__ import annotations

from typing import Any

from django.db.migrations.operations import AddIndex


class AddIndexConcurrently(AddIndex):
    """``AddIndex`` that builds the index ``CONCURRENTLY`` on PostgreSQL.

    An inbox table in production can hold millions of rows; a plain ``CREATE INDEX`` would
    block every worker's writes while it is built. Other databases get a plain ``AddIndex``.
    Migrations using it must set ``atomic = False``.
    """

    atomic = False

    def _concurrently(self, schema_editor: Any) -> dict[str, bool]:
        return {"concurrently": True} if schema_editor.connection.vendor == "postgresql" else {}

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.add_index(model, self.index, **self._concurrently(schema_editor))

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            schema_editor.remove_index(model, self.index, **self._concurrently(schema_editor))
