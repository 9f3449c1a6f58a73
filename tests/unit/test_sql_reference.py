"""Every hand-written statement, as PostgreSQL receives it, is in ``docs/reference/sql.md``:
a reviewer reads SQL there, not f-strings. The test runs a message's whole life on PostgreSQL
(deliveries, duplicates, a batch, workers, an ordered consumer's versions out of order, the
operator's actions, purge, stats, the checks, the outbox's publish and relay rows), records each
statement sent from ``django_inbox/db/statements/`` and the outbox's own SQL with the function
that sent it, and compares the page with what it recorded. Every function of those modules that
executes SQL must have been recorded.

After changing a statement, write the page again::

    INBOX_WRITE_SQL_REFERENCE=1 DATABASE_URL=postgres://... pytest tests/unit/test_sql_reference.py
"""

from __future__ import annotations

import ast
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from django_inbox import deliver, store
from django_inbox.intake.batches import deliver_batch
from django_inbox.intake.rows import prepare
from django_inbox.models import InboxMessage
from django_inbox.services import collect, known_consumers, park, purge, replay, select
from tests import ordered
from tests.conftest import ROOT

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PAGE = ROOT / "docs" / "reference" / "sql.md"
SOURCES = [
    *sorted((ROOT / "django_inbox" / "db" / "statements").glob("*.py")),
    ROOT / "django_inbox" / "outbox" / "held.py",
    ROOT / "django_inbox" / "outbox" / "rows.py",
    ROOT / "django_inbox" / "outbox" / "publishing.py",
]
KEYWORDS = (
    "SELECT",
    "FROM",
    "WHERE",
    "SET",
    "VALUES",
    "RETURNING",
    "ON CONFLICT",
    "ORDER BY",
    "LIMIT",
    "FOR UPDATE",
    "CROSS JOIN",
    "LEFT JOIN",
    "UNION ALL",
    "GROUP BY",
)


#: Functions of :data:`SOURCES` that execute SQL on other databases only (not recorded here).
OTHER_DATABASES = {
    # MySQL and MariaDB: the insert without ON CONFLICT, and the pair's status read with a
    # shared lock after a refused insert (tests/system/test_mariadb.py, the MariaDB phase)
    "django_inbox.db.statements.hot._insert_plain",
    "django_inbox.db.statements.hot._pair_status",
}


def _name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def executing_functions() -> set[str]:
    """``module.function`` of every function of :data:`SOURCES` that calls ``execute``."""
    found: set[str] = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            calls = [
                call
                for call in ast.walk(node)
                if isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "execute"
            ]
            if calls:
                found.add(f"{_name(path)}.{node.name}")
    return found


class Recorder:
    """An execute wrapper: each statement sent from :data:`SOURCES`, by the function that
    sent it."""

    def __init__(self) -> None:
        self.files = {str(path): _name(path) for path in SOURCES}
        self.sent: dict[str, list[str]] = {}

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        frame = sys._getframe(1)
        while frame is not None:
            module = self.files.get(frame.f_code.co_filename)
            if module is not None:
                texts = self.sent.setdefault(f"{module}.{frame.f_code.co_name}", [])
                if sql not in texts:
                    texts.append(sql)
                break
            frame = frame.f_back
        return execute(sql, params, many, context)


def message(consumer: str, message_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "consumer": consumer,
        "message_id": message_id,
        "event_type": "effect.write",
        "payload": {"n": 1},
        **extra,
    }


def a_whole_life() -> None:
    """Every statement the inbox and the outbox send in a message's life."""
    deliver(**message("effects", "m-1"))  # new: inserted completed
    deliver(**message("effects", "m-1"))  # a duplicate
    store(**message("effects", "m-2", headers={"h": "v"}, source="shop"))
    deliver(**message("effects", "m-2"))  # stored: claimed by id and run
    store(**message("effects", "m-3"))
    store(**message("effects", "m-4"))
    ordered.drain("effects")  # claimed fresh and completed
    deliver_batch([prepare(**message("effects", f"b-{i}")) for i in range(3)])
    versions = ordered.Versions("ordered", "ordered.apply")
    versions.send("K", 1)  # a new key's first version
    versions.put("K", 3)
    versions.put("K", 2)
    versions.put("L", 1)
    versions.put("K", None, message_id="K-note")  # keyed, no sequence: locks, applies nothing
    ordered.drain("ordered")  # set aside, locked, applied, completed, released
    versions.put("K", 5)
    ordered.drain("ordered")  # waits behind a hole
    store(**message("effects", "dead-1"))
    InboxMessage.objects.filter(message_id="dead-1").update(status="dead")
    actor = {"actor": "sql reference", "reason": "render"}
    replay(select(consumer="effects", statuses=["dead"]), **actor)
    park(select(consumer="effects", message_ids=["dead-1"]), **actor)
    InboxMessage.objects.filter(message_id="dead-1").update(status="dead")
    purge(statuses=("completed",), older_than=0)
    purge(statuses=("dead",), older_than=0)
    collect()
    known_consumers()
    call_command("check", "--database", "default", verbosity=0)
    from django.db import transaction

    from django_inbox.outbox import rows
    from django_inbox.outbox.publishing import publish

    with transaction.atomic():
        publish("order.placed", {"n": 1}, routing_key="orders", key="order-1")
        publish("order.placed", {"n": 2}, routing_key="orders", key="order-1")
    lease, claimed = rows.claim(10, "default")
    rows.mark_sent([row.pk for row in claimed], lease, "default", [row.key for row in claimed])


def pretty(sql: str) -> str:
    """One clause a line: a newline before each of :data:`KEYWORDS` outside parentheses."""
    out, depth, i = [], 0, 0
    pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in KEYWORDS) + r")\b")
    while i < len(sql):
        char = sql[i]
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if depth == 0 and i and sql[i - 1] == " ":
            found = pattern.match(sql, i)
            if found:
                out[-1:] = ["\n"]
        out.append(char)
        i += 1
    return "".join(out).strip()


def page(sent: dict[str, list[str]]) -> str:
    head = (
        "# SQL the inbox sends\n\n"
        "Every hand-written statement of `django_inbox/db/statements/` and the outbox, as "
        "PostgreSQL receives it (parameters as `%s`), under the function that sends it. "
        "Written by `tests/unit/test_sql_reference.py`, which fails when a statement changes "
        "and this page does not; write it again with `INBOX_WRITE_SQL_REFERENCE=1`. The ORM's "
        "own queries, and the SQL of migrations, are not here. One migration adds work to "
        "these statements: every insert into the inbox's table of a row that would run fires "
        "the `BEFORE INSERT` trigger `django_inbox_late_copy` of migration `0015` (one statement "
        "probing the tombstones and the pair's row, and for a duplicate a shared advisory lock "
        "and a second probe: see "
        "[Late copies after purge](../howto/retention.md#late-copies-after-purge)).\n"
    )
    parts = [head]
    for function in sorted(sent):
        parts.append(f"\n## `{function}`\n")
        for sql in sent[function]:
            parts.append(f"\n```sql\n{pretty(sql)}\n```\n")
    return "".join(parts)


def test_the_sql_reference_is_what_postgresql_receives() -> None:
    recorder = Recorder()
    with connection.execute_wrapper(recorder):
        a_whole_life()
    missing = executing_functions() - set(recorder.sent) - OTHER_DATABASES
    assert not missing, f"not sent by the scenario (add a step that sends them): {missing}"
    written = page(recorder.sent)
    if os.environ.get("INBOX_WRITE_SQL_REFERENCE"):
        PAGE.write_text(written)
    assert PAGE.read_text() == written, (
        "a statement changed: write docs/reference/sql.md again (INBOX_WRITE_SQL_REFERENCE=1)"
    )
