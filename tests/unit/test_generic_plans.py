"""The inbox's prepared statements keep index plans as generic plans.

Workers and ``deliver()`` send their own statements prepared (``db/preparing.py``). After a
few runs of a prepared statement PostgreSQL may switch it to a generic plan, one made without
the parameters' values, and keep it for the connection's life. A generic plan that reads a
table or a whole index would go unnoticed by the other plan tests, which EXPLAIN statements
with their values inlined.

This test runs the inbox's work (new messages, duplicates, stored messages drained with a
retry, an ordered consumer's versions out of order, outbox publications, a relay's claims and
marks) behind a backlog the statistics never saw, collects every statement text the process
prepared (13 here: the deduplicating insert, a duplicate's status, the claims, completions,
an ordered key's lock and release, setting a version aside, the outbox's insert and release), and
runs each one again as PostgreSQL's generic plan (``plan_cache_mode = force_generic_plan``),
with the parameters it was last sent, in a transaction rolled back: none may read more than
1,000 rows of the backlog. An insert whose row is there already (the outbox's, by message id)
cannot run again: its generic plan is checked to look every row up by an index condition.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection

from django_inbox import deliver, store
from django_inbox.db import preparing
from django_inbox.models import InboxMessage
from django_inbox.outbox import publish
from django_inbox.outbox import rows as outbox_rows
from django_inbox.outbox.models import OutboxMessage
from django_inbox.processing.worker import Worker
from tests.plans import indexes, rows_read, take_statistics

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

INBOX = InboxMessage._meta.db_table
OUTBOX = OutboxMessage._meta.db_table
BACKLOG = 50_000
#: Rows a statement may read in this test's work (its batches are of 3 and 10 rows), far
#: fewer than the backlog's 150,000.
FEW = 1_000
#: The type a parameter has that psycopg lets the server infer (``unknown``).
UNKNOWN = 705
_PLACEHOLDER = re.compile(r"%s|%%")


def _backlog() -> None:
    """Due rows of a consumer nobody serves here, rows of the test's consumers due tomorrow,
    waiting versions of an ordered consumer's other keys, and pending outbox rows of another
    key, none of them in the statistics."""
    columns = (
        "consumer, message_id, source, rerun, event_type, payload, headers, status, attempts, "
        "last_error, history, received_at, updated_at, next_attempt_at, lease_id, key, sequence"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {INBOX} ({columns}) SELECT c, c || '-' || i, '', false, e, '{{}}', "
            "'{}', s, 0, '', '[]', now(), now(), d, '', k, q FROM generate_series(1, "
            f"{BACKLOG}) i, LATERAL (VALUES "
            "('other', 'effect.write', 'received', now() - interval '1 minute', '', NULL), "
            "('effects', 'effect.write', 'received', now() + interval '1 day', '', NULL), "
            "('ordered', 'ordered.apply', 'waiting', now() + interval '1 day', 'k-' || i, 2)"
            ") AS v(c, e, s, d, k, q)"
        )
        cursor.execute(
            f"INSERT INTO {OUTBOX} (message_id, event_type, payload, headers, exchange, "
            "routing_key, key, status, attempts, last_error, created_at, updated_at, "
            "next_attempt_at, lease_id, causation_consumer, causation_message_id) SELECT "
            "'o-' || i, 'e', '{}', '{}', '', 'q', 'busy', 'pending', 0, '', now(), now(), NULL, "
            f"'', '', '' FROM generate_series(1, {BACKLOG}) i"
        )


def _work() -> None:
    for n in range(3):
        deliver(consumer="effects", message_id=f"new-{n}", event_type="effect.write", payload={})
    for n in range(3):
        deliver(consumer="effects", message_id=f"new-{n}", event_type="effect.write", payload={})
    for n in range(4):
        store(consumer="effects", message_id=f"s-{n}", event_type="effect.write", payload={})
    store(
        consumer="effects", message_id="retried", event_type="effect.write",
        payload={"fail_times": 1},
    )  # fmt: skip
    for key in ("a", "b"):
        for sequence in (2, 1, 4, 3):
            store(
                consumer="ordered", message_id=f"{key}-{sequence}", event_type="ordered.apply",
                payload={}, key=key, sequence=sequence,
            )  # fmt: skip
    Worker(["effects", "ordered"], until_idle=0, poll_interval=0.01, batch_size=3).run()
    Worker(["effects"], until_idle=1.5, poll_interval=0.05).run()  # the retry, once due
    for n in range(3):
        publish("e", {"n": n}, routing_key="q")
        publish("e", {"n": n}, routing_key="q", key=f"key-{n}")
        publish("e", {"n": n}, routing_key="q", key="key-0")
    for _ in range(3):
        lease_id, claimed = outbox_rows.claim(10, "default")
        outbox_rows.mark_sent(
            [row.pk for row in claimed], lease_id, "default", [row.key for row in claimed]
        )
    assert InboxMessage.objects.filter(consumer="ordered", status="completed").count() == 8
    assert InboxMessage.objects.get(message_id="retried").status == "completed"


def _numbered(query: str) -> tuple[str, int]:
    """``query`` with psycopg's ``%s`` placeholders as ``$1`` … ``$n``, and ``n``."""
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        if match.group() == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(number, query), count


def _unbounded(node: dict[str, Any]) -> bool:
    """Whether a plan (not run) scans a table or an index without an index condition."""
    kind = node["Node Type"]
    if kind == "Seq Scan" or ("Index Name" in node and "Index Cond" not in node):
        return True
    return any(_unbounded(child) for child in node.get("Plans", []))


def _types(raw: Any, params: Any) -> list[str]:
    """The types psycopg sends ``params`` as (``unknown`` where it lets the server infer)."""
    from psycopg.adapt import PyFormat, Transformer

    transformer = Transformer(raw)
    transformer.dump_sequence(list(params), [PyFormat.AUTO] * len(params))
    with raw.cursor() as cursor:
        cursor.execute(
            "SELECT format_type(t, NULL) FROM unnest(%s::oid[]) WITH ORDINALITY AS u(t, n) "
            "ORDER BY n",
            [[oid or UNKNOWN for oid in transformer.types]],
        )
        return [name for (name,) in cursor.fetchall()]


def _generic_run(raw: Any, query: str, params: Any, n: int) -> dict[str, Any]:
    """Run ``query`` with ``params`` as its generic plan, in a transaction rolled back; return
    the analyzed plan. An insert that cannot run again (its row is there: a unique violation)
    is planned only, and marked ``"not run"``."""
    import psycopg
    from psycopg import sql

    text, count = _numbered(query)
    types = _types(raw, params)
    assert len(types) == count, (query, params)
    values = sql.SQL(", ").join(sql.Literal(value) for value in params).as_string(raw)
    with raw.cursor() as cursor:
        cursor.execute(f"PREPARE generic_{n} ({', '.join(types)}) AS {text}")
        try:
            try:
                cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE generic_{n}({values})")
                plan: dict[str, Any] = cursor.fetchone()[0][0]["Plan"]
            except psycopg.errors.UniqueViolation:
                raw.rollback()
                cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE generic_{n}({values})")
                plan = {**cursor.fetchone()[0][0]["Plan"], "not run": True}
        finally:
            raw.rollback()
            cursor.execute(f"DEALLOCATE generic_{n}")
            raw.commit()
    return plan


def test_every_prepared_statement_keeps_index_lookups_as_a_generic_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sent: dict[str, Any] = {}
    execute = preparing.PreparingCursor.execute

    def recording(self: Any, query: Any, params: Any = None, **options: Any) -> Any:
        sent[query] = params or ()
        return execute(self, query, params, **options)

    monkeypatch.setattr(preparing.PreparingCursor, "execute", recording)
    InboxMessage.objects.create(
        consumer="effects", message_id="seen", event_type="effect.write", payload={},
        status="completed",
    )  # fmt: skip
    take_statistics(INBOX)
    take_statistics(OUTBOX)
    _backlog()
    preparing.state.reset()
    _work()
    prepared = [query for query, runs in preparing.state.seen.items() if runs >= 2]
    assert len(prepared) >= 12, prepared  # the hot path's statements were prepared (13)
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"], port=settings["PORT"] or 5432, user=settings["USER"],
        dbname=settings["NAME"],
    ) as raw:  # fmt: skip
        raw.execute("SET plan_cache_mode = force_generic_plan")
        raw.commit()
        plans = {
            query: _generic_run(raw, query, sent[query], n) for n, query in enumerate(prepared)
        }
    wide = {
        query: json.dumps(plan, indent=1)
        for query, plan in plans.items()
        if (_unbounded(plan) if plan.get("not run") else rows_read(plan) > FEW)
    }
    assert not wide, "\n\n".join(f"{query}\n{plan}" for query, plan in wide.items())
    run = [query for query, plan in plans.items() if indexes(plan) and not plan.get("not run")]
    assert len(run) >= 8, plans  # most statements ran again and read rows through an index
