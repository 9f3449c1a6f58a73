"""Query plans in tests: ``EXPLAIN`` a statement a test captured, and read what its scans did
(for the tests that a statement's plan stays right whatever PostgreSQL's statistics say)."""

from __future__ import annotations

from typing import Any

from django.db import connection, transaction


def take_statistics(table: str) -> None:
    """``ANALYZE`` ``table`` now, and keep those statistics for the rest of the test: autovacuum
    is turned off for the table (in the test database), since the rows a test then loads could
    make it analyze the table again under the test. The test's statements are then planned
    with statistics from before what it loaded."""
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        cursor.execute(f"ANALYZE {table}")


def explain(sql: str, *, analyze: bool = False) -> dict[str, Any]:
    """The top node of ``sql``'s plan (``analyze``: run it, in a savepoint or transaction)."""
    options = "ANALYZE, FORMAT JSON" if analyze else "FORMAT JSON"
    with connection.cursor() as cursor, transaction.atomic():
        cursor.execute(f"EXPLAIN ({options}) {sql}")
        plan: dict[str, Any] = cursor.fetchone()[0][0]["Plan"]
    return plan


def rows_read(node: dict[str, Any]) -> int:
    """Rows the scans of an analyzed plan read (kept or filtered out), over all their loops;
    a subquery's scan reads no table, only its child's rows, which are counted there."""
    read = 0
    if "Scan" in node["Node Type"] and node["Node Type"] != "Subquery Scan":
        kept = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        read = kept * node.get("Actual Loops", 1)
    return read + sum(rows_read(child) for child in node.get("Plans", []))


def indexes(node: dict[str, Any]) -> set[str]:
    """The indexes a plan's scans read."""
    found = {node["Index Name"]} if "Index Name" in node else set()
    for child in node.get("Plans", []):
        found |= indexes(child)
    return found
