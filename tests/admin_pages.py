"""The admin's pages on a large inbox table: the seed, the pages, and the checks of the SQL
each page runs. Shared by ``tests/system/test_admin_scale.py`` (which checks the SQL and the
plans, untimed) and ``bench/admin_pages.py`` (which times the same pages on the same data).
Importing it has no side effect: nothing sets Django up.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

TABLE = "django_inbox_inboxmessage"
#: Consumers of the seeded rows: those of the test project, so the filters list them.
CONSUMERS = ("inventory", "payments", "audit", "stream", "effects")
#: Event types, by share of rows: order.placed 40 %, effect.write 20 %, the rest 10 % each.
EVENT_TYPES = (
    "order.placed",
    "order.placed",
    "effect.write",
    "order.paid",
    "order.placed",
    "order.shipped",
    "effect.write",
    "refund.issued",
    "customer.updated",
    "order.placed",
)
#: Indexes of the inbox table that a page's rows may come through.
INBOX_INDEXES = (
    "django_inbox_attention_idx",
    "django_inbox_attention_id_idx",
    "django_inbox_in_progress_idx",
    "django_inbox_polled_idx",
    "django_inbox_failed_idx",
    "django_inbox_key_idx",
    "django_inbox_source_idx",
    "django_inbox_identity_idx",
    "django_inbox_consumer_idx",
    f"{TABLE}_pkey",
)

# One statement, all in the server: row i (1 … n) belongs to consumer i % 5 and arrived
# (n - i) * 30 days / n ago, so ids follow arrival as they do in a real inbox and the last
# hour holds n / 720 rows. Statuses: the newest `backlog` rows (1,500 by default) are received
# and the 100 before them in progress (their lease still running); every 499th row is dead
# (2,000 on 1M rows, spread over the whole month), every 3,001st parked, and every 71st of the
# 72,000 before the backlog failed (waiting for their retry); everything else is completed.
# Payloads are about 200 bytes of order JSON; failed rows carry one history entry with a
# traceback.
SEED_SQL = """
INSERT INTO django_inbox_inboxmessage (
    consumer, message_id, source, event_type, key, payload, headers, status, attempts,
    last_error, history, received_at, updated_at, next_attempt_at, locked_until, lease_id,
    processed_at)
SELECT
    r.consumer, r.message_id, 'shop.orders', r.event_type, 'customer-' || r.customer,
    jsonb_build_object(
        'order_id', 'ORD-' || lpad(r.i::text, 9, '0'),
        'customer_id', 'CUS-' || r.customer,
        'amount', round((r.i * 37 % 100000) / 100.0, 2),
        'currency', 'EUR',
        'items', jsonb_build_array(jsonb_build_object(
            'sku', 'SKU-' || (r.i % 5000), 'qty', 1 + r.i % 3,
            'price', round((r.i * 13 % 10000) / 100.0, 2))),
        'placed_at', to_char(r.received_at, 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        'channel', 'web'),
    jsonb_build_object('content_type', 'application/json', 'trace_id', md5('trace-' || r.i)),
    r.status,
    CASE r.status WHEN 'received' THEN 0 WHEN 'dead' THEN 8 WHEN 'failed' THEN 1 + r.i % 3
        ELSE 1 END,
    CASE WHEN r.status IN ('dead', 'failed')
        THEN 'TimeoutError: payment gateway timed out after 30s'
        WHEN r.status = 'parked' THEN 'Park: held for manual review' ELSE '' END,
    CASE WHEN r.status IN ('dead', 'failed', 'parked') THEN jsonb_build_array(jsonb_build_object(
        'kind', 'error', 'at', to_char(r.received_at, 'YYYY-MM-DD"T"HH24:MI:SS"+00:00"'),
        'type', 'TimeoutError', 'message', 'payment gateway timed out after 30s',
        'traceback', E'Traceback (most recent call last):\\n  File "shop/handlers.py", line 42, '
            || E'in charge\\nTimeoutError: payment gateway timed out after 30s\\n',
        'attempt', 1, 'outcome', r.status, 'retry_at', NULL))
        ELSE '[]'::jsonb END,
    r.received_at,
    r.received_at + CASE r.status WHEN 'dead' THEN interval '10 minutes'
        WHEN 'received' THEN interval '0' ELSE interval '1 second' END,
    CASE r.status WHEN 'received' THEN r.received_at
        WHEN 'failed' THEN now() + (r.i % 600) * interval '1 second'
        WHEN 'in_progress' THEN now() + interval '30 seconds' END,
    CASE WHEN r.status = 'in_progress' THEN now() + interval '30 seconds' END,
    CASE WHEN r.status = 'in_progress' THEN md5('lease-' || r.i)::uuid::text ELSE '' END,
    CASE WHEN r.status = 'completed' THEN r.received_at + interval '50 milliseconds' END
FROM (
    SELECT
        i,
        (ARRAY['{consumers}'])[1 + i % {n_consumers}] AS consumer,
        md5('message-' || i)::uuid::text AS message_id,
        (ARRAY['{event_types}'])[1 + (i / {n_consumers}) % {n_event_types}] AS event_type,
        i * 7919 % 100000 AS customer,
        now() - ({n} - i) * (interval '30 days' / {n}) AS received_at,
        CASE
            WHEN i > {n} - {backlog} THEN 'received'
            WHEN i > {n} - {backlog} - 100 THEN 'in_progress'
            WHEN i % 499 = 123 THEN 'dead'
            WHEN i % 3001 = 7 THEN 'parked'
            WHEN i > {n} - {backlog} - 72000 AND i % 71 = 3 THEN 'failed'
            ELSE 'completed'
        END AS status
    FROM generate_series(1::bigint, {n}) AS i
) AS r
"""


def seed_sql(rows: int, backlog: int = 1500) -> str:
    """The ``INSERT … SELECT generate_series`` that adds ``rows`` rows, the newest ``backlog``
    of them still to process (see :data:`SEED_SQL`)."""
    if rows < 2000 or not 0 < backlog <= rows - 500:
        raise ValueError("seed at least 2,000 rows, and a backlog of 1 to rows - 500")
    return SEED_SQL.format(
        n=int(rows),
        backlog=int(backlog),
        consumers="', '".join(CONSUMERS),
        n_consumers=len(CONSUMERS),
        event_types="', '".join(EVENT_TYPES),
        n_event_types=len(EVENT_TYPES),
    )


def seed(rows: int, *, backlog: int = 1500, vacuum: bool = True) -> float:
    """Add ``rows`` rows to the inbox table of Django's default database (the newest
    ``backlog`` received), then ``VACUUM (ANALYZE)`` it (``ANALYZE`` alone with
    ``vacuum=False``, e.g. inside a transaction). Returns the seconds taken."""
    from django.db import connection

    began = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(seed_sql(rows, backlog))
        cursor.execute(f"{'VACUUM (ANALYZE)' if vacuum else 'ANALYZE'} {TABLE}")
    return time.perf_counter() - began


# ----------------------------------------------------------------------------- pages


@dataclass(frozen=True)
class Page:
    key: str
    title: str
    url: str
    #: Indexes the plan of the page's row query must read the rows through (not the primary
    #: key: walking it newest first while filtering on a rare value may read the whole table).
    needs_index: tuple[str, ...] = ()


@dataclass(frozen=True)
class Targets:
    """What the pages look for: a consumer, a message id and a row to open."""

    consumer: str
    message_id: str
    detail_pk: int
    event_type: str = "order.paid"


def targets() -> Targets:
    """A dead row near the middle of the table: its consumer, message id and primary key."""
    from django_inbox.models import InboxMessage

    rows = InboxMessage.objects.filter(status="dead", consumer="payments").order_by("updated_at")
    count = rows.count()
    row = rows.values("pk", "consumer", "message_id")[count // 2]
    return Targets(consumer=row["consumer"], message_id=row["message_id"], detail_pk=row["pk"])


def pages(found: Targets) -> list[Page]:
    """The pages an operator opens during triage, as in the summary's and filters' links."""
    from django.urls import reverse

    changelist = reverse("admin:django_inbox_inboxmessage_changelist")

    def url(**params: Any) -> str:
        return f"{changelist}?{urlencode(params)}" if params else changelist

    # Either index of the dead and parked rows: by (consumer, updated_at), or by id.
    attention = ("django_inbox_attention_idx", "django_inbox_attention_id_idx")
    return [
        Page("list", "changelist, no filter", url()),
        Page("dead", "status = dead", url(status__exact="dead"), needs_index=attention),
        Page("completed", "status = completed", url(status__exact="completed")),
        Page("consumer", f"consumer = {found.consumer}", url(consumer=found.consumer)),
        Page(
            "consumer_failed",
            f"consumer = {found.consumer}, status = failed",
            url(consumer=found.consumer, status__exact="failed"),
            needs_index=("django_inbox_failed_idx", "django_inbox_polled_idx"),
        ),
        Page(
            "consumer_dead",
            f"consumer = {found.consumer}, status = dead",
            url(consumer=found.consumer, status__exact="dead"),
            needs_index=attention,
        ),
        Page("event_type", f"event type = {found.event_type}", url(event_type=found.event_type)),
        Page("received_1h", "received in the last hour", url(received="1h")),
        Page(
            "search",
            "search: exact message id",
            url(q=found.message_id),
            needs_index=("django_inbox_identity_idx",),
        ),
        Page(
            "search_key",
            "search: key:customer-4242",
            url(q="key:customer-4242"),
            needs_index=("django_inbox_key_idx",),
        ),
        Page(
            "search_source",
            "search: a source no row has",
            url(q="source:nobody"),
            needs_index=("django_inbox_source_idx",),
        ),
        Page("page_50", "page 50, no filter", url(p=50)),
        Page(
            "detail",
            "detail page of a dead row",
            reverse("admin:django_inbox_inboxmessage_change", args=[found.detail_pk]),
        ),
    ]


# ----------------------------------------------------------------------------- query checks

POLLED = frozenset({"received", "failed", "in_progress"})
ATTENTION = frozenset({"dead", "parked"})
#: Ordered consumers' waiting rows: a partial index of their own (django_inbox_waiting_idx).
WAITING = frozenset({"waiting"})
_STATUS_IN = re.compile(r'"status"\s+IN\s+\(([^)]*)\)', re.IGNORECASE)
_STATUS_EQ = re.compile(r"\"status\"\s+=\s+'([^']*)'", re.IGNORECASE)
_LIMITED_SUBQUERY = re.compile(r"COUNT\(\*\)\s+FROM\s+\(SELECT\b.*\bLIMIT\s+\d+\)", re.S | re.I)


def without_exists(sql: str) -> str:
    """``sql`` without its ``EXISTS(…)`` subqueries: probes made for each row the outer query
    reads, which restrict nothing about which rows it reads."""
    out, i = [], 0
    while (start := sql.find("EXISTS(", i)) >= 0:
        out.append(sql[i:start])
        depth, j = 0, start + len("EXISTS")
        for j in range(start + len("EXISTS"), len(sql)):
            depth += {"(": 1, ")": -1}.get(sql[j], 0)
            if depth == 0:
                break
        out.append("EXISTS(…)")
        i = j + 1
    return "".join(out) + sql[i:]


def statuses_of(sql: str) -> set[str]:
    """The statuses a query's WHERE restricts the rows to (empty: no status restriction);
    those of ``EXISTS`` subqueries don't count (:func:`without_exists`)."""
    sql = without_exists(sql)
    found: set[str] = set()
    for group in _STATUS_IN.findall(sql):
        found.update(re.findall(r"'([^']*)'", group))
    found.update(_STATUS_EQ.findall(sql))
    return found


def on_partial_index(sql: str) -> bool:
    """Whether the rows are restricted to the statuses of one of the partial indexes (few rows:
    dead/parked, waiting, or those still to process)."""
    statuses = statuses_of(sql)
    return bool(statuses) and any(statuses <= index for index in (POLLED, ATTENTION, WAITING))


def full_table_query(sql: str) -> str | None:
    """Why ``sql`` would read the whole inbox table, or ``None``: a ``COUNT`` not bounded by a
    ``LIMIT`` subquery, or a ``SELECT DISTINCT``, unless its rows are restricted to a partial
    index's statuses."""
    if f'"{TABLE}"' not in sql or on_partial_index(sql):
        return None
    if re.search(r"\bCOUNT\(", sql, re.I) and not _LIMITED_SUBQUERY.search(sql):
        return "unbounded count"
    if re.search(r"\bSELECT\s+DISTINCT\b", sql, re.I):
        return "SELECT DISTINCT"
    return None


def row_query(queries: list[dict[str, Any]]) -> str | None:
    """The query that fetches the changelist's rows: the last ordered ``SELECT`` of inbox rows
    that is not a count (the changelist's ordering always ends with the primary key)."""
    found = None
    for query in queries:
        sql = query["sql"]
        if (
            sql.startswith("SELECT")
            and f'FROM "{TABLE}"' in sql
            and re.search(rf'ORDER BY .*"{TABLE}"\."id" DESC', sql)
            and "COUNT(" not in sql.upper()
        ):
            found = str(sql)
    return found


def explain(sql: str, *, analyze: bool = False) -> str:
    """The plan of ``sql`` (as captured, parameters inlined) on Django's default database."""
    from django.db import connection

    options = "ANALYZE, BUFFERS, " if analyze else ""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN ({options}FORMAT TEXT) {sql}")
        return "\n".join(line for (line,) in cursor.fetchall())


_SCAN = re.compile(
    r"(Seq Scan|Parallel Seq Scan|Index Scan Backward|Index Scan|Index Only Scan|"
    r"Bitmap Index Scan)(?: using (\S+))? on (\S+)"
)


def scans(plan: str) -> list[str]:
    """The plan's table and index accesses, e.g. ``Index Scan using x on t``, in order."""
    found = []
    for kind, index, table in _SCAN.findall(plan):
        if kind == "Bitmap Index Scan":  # "Bitmap Index Scan on <index>"
            found.append(f"{kind} on {table}")
        elif index:
            found.append(f"{kind} using {index}")
        elif table == TABLE:
            found.append(kind)
    return found


def uses_index(plan: str, indexes: tuple[str, ...] = INBOX_INDEXES) -> bool:
    """Whether the plan reads the inbox through one of ``indexes`` and never by a sequential
    scan of it."""
    accesses = scans(plan)
    if any("Seq Scan" in access for access in accesses):
        return False
    return any(access.rsplit(" ", 1)[-1] in indexes for access in accesses)


def full_scans(sql: str) -> list[str]:
    """Sequential scans of the inbox in the plan of ``sql`` (``EXPLAIN``, not run) that read
    the whole table: those without a ``LIMIT`` above them that PostgreSQL expects to reach.
    A scan under ``LIMIT n`` whose filter matches many more rows stops after about ``n``
    matches (``SELECT count(*) FROM (… LIMIT 10001)`` of completed rows reads ~10,000 rows);
    one whose filter matches fewer rows than the limit reads everything."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        found = cursor.fetchone()[0]
    plan = json.loads(found) if isinstance(found, str | bytes) else found
    unbounded: list[str] = []

    def walk(node: dict[str, Any], bounded: bool) -> None:
        kind = node.get("Node Type", "")
        if kind == "Seq Scan" and node.get("Relation Name") == TABLE and not bounded:
            parallel = " (parallel)" if node.get("Parallel Aware") else ""
            unbounded.append(f"Seq Scan{parallel} on {TABLE}, filter {node.get('Filter', '-')}")
        children = node.get("Plans", [])
        for child in children:
            reached = kind == "Limit" and node.get("Plan Rows", 0) < child.get("Plan Rows", 0)
            walk(child, bounded or reached)

    walk(plan[0]["Plan"], False)
    return unbounded


# ----------------------------------------------------------------------------- measuring


@dataclass
class Visit:
    response: Any
    seconds: float
    queries: list[dict[str, Any]]

    @property
    def status(self) -> int:
        return int(self.response.status_code)

    @property
    def sql_seconds(self) -> float:
        return sum(float(q.get("time") or 0) for q in self.queries)


def visit(client: Any, url: str) -> Visit:
    """GET ``url`` with the client, timing it and capturing its SQL."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        began = time.perf_counter()
        response = client.get(url)
        seconds = time.perf_counter() - began
    return Visit(response, seconds, list(captured.captured_queries))


def login(client: Any) -> None:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user = user_model.objects.filter(username="bench-admin").first()
    if user is None:
        user = user_model.objects.create_superuser("bench-admin", "bench@example.com", None)
    client.force_login(user)
