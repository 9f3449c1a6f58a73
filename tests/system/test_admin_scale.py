"""The admin on a table of 1,000,000 rows: every triage page answers without reading the whole
table, proven by the SQL each page runs (captured) and the plans PostgreSQL makes for it
(``EXPLAIN``, not timed). The wall time of each page is printed (``pytest -s``), not asserted.

The seed, the pages and the query checks are in ``tests/admin_pages.py``; the benchmark
``bench/admin_pages.py`` times the same pages on the same data.
"""

from __future__ import annotations

import time

import pytest
from django.test import Client

from django_inbox.admin.paginator import COUNT_CAP
from django_inbox.models import InboxMessage
from django_inbox.services.stats import estimated_rows
from tests import admin_pages
from tests.admin_pages import (
    Page,
    Visit,
    explain,
    full_scans,
    full_table_query,
    row_query,
    scans,
)

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROWS = 1_000_000
#: Pages whose filter has no index, so counting their rows (``count(*)`` of ``… LIMIT 10001``)
#: would read the whole table when fewer than 10,001 rows match. None: "received in the last
#: hour" (~1,400 of the 1,000,000 rows) reads the newest blocks through the BRIN index on
#: received_at (migration 0004).
UNINDEXED_FILTERS: frozenset[str] = frozenset()


def seeded_dead_rows(rows: int) -> int:
    """Dead rows of :func:`tests.admin_pages.seed_sql`: every 499th (``i % 499 == 123``),
    except among the newest 1,600 (received or in progress)."""
    return len(range(123, rows - 1600 + 1, 499))


def check_page(page: Page, visit: Visit) -> list[str]:
    """What is wrong with one page view: its status, queries that read the whole table, and a
    row query that misses the index it needs."""
    problems = []
    if visit.status != 200:
        problems.append(f"{page.key}: HTTP {visit.status}")
    for query in visit.queries:
        sql = query["sql"]
        why = full_table_query(sql)
        if why:
            problems.append(f"{page.key}: {why}: {sql}")
        reads_inbox = sql.startswith(("SELECT", "WITH")) and f'"{admin_pages.TABLE}"' in sql
        if reads_inbox and page.key not in UNINDEXED_FILTERS:
            problems += [f"{page.key}: {scan}: {sql}" for scan in full_scans(sql)]
    if page.needs_index:
        sql = row_query(visit.queries)
        if sql is None:
            problems.append(f"{page.key}: no row query found")
        else:
            plan = explain(sql)
            if not admin_pages.uses_index(plan, page.needs_index):
                problems.append(
                    f"{page.key}: the rows are not read through {page.needs_index}:\n{plan}"
                )
    return problems


@pytest.mark.django_db(transaction=True)
def test_changelist_summary_and_detail_stay_indexed_on_a_million_rows(
    django_user_model: type,
) -> None:
    began = time.perf_counter()
    seed_seconds = admin_pages.seed(ROWS)
    dead = seeded_dead_rows(ROWS)
    assert InboxMessage.objects.filter(status="dead").count() == dead
    estimate = estimated_rows("default")
    assert abs(estimate - ROWS) < ROWS * 0.05, f"PostgreSQL estimates {estimate:,} rows"

    django_user_model.objects.create_superuser("ops", "ops@example.com", "ops-password")
    client = Client()
    assert client.login(username="ops", password="ops-password")
    found = admin_pages.targets()
    pages = admin_pages.pages(found)
    assert [page.key for page in pages] == [
        "list",
        "dead",
        "completed",
        "consumer",
        "consumer_failed",
        "consumer_dead",
        "event_type",
        "received_1h",
        "search",
        "search_key",
        "search_source",
        "page_50",
        "detail",
    ]

    visits: dict[str, Visit] = {}
    problems: list[str] = []
    for page in pages:
        admin_pages.visit(client, page.url)  # warm-up: the table's pages into the cache
        visits[page.key] = visit = admin_pages.visit(client, page.url)
        problems += check_page(page, visit)

    lines = [
        "",
        f"admin pages on {ROWS:,} rows (seeded and vacuumed in {seed_seconds:.1f} s)",
        f"{'page':44s} {'wall ms':>8s} {'queries':>7s} {'SQL ms':>7s}  rows read through",
    ]
    for page in pages:
        visit = visits[page.key]
        sql = row_query(visit.queries)
        reads = ", ".join(scans(explain(sql))) if sql else "-"
        scanned = sum(
            len(full_scans(q["sql"])) for q in visit.queries if q["sql"].startswith("SELECT")
        )
        if scanned:
            reads += f"; {scanned} full scan(s) of the table"
        lines.append(
            f"{page.title:44s} {visit.seconds * 1000:8.1f} {len(visit.queries):7d} "
            f"{visit.sql_seconds * 1000:7.1f}  {reads}"
        )
    print("\n".join(lines))
    assert not problems, "\n\n".join(problems)

    # The pages show what they should, not only quickly.
    listing = visits["list"].response.context
    assert listing["cl"].count_is_estimate, "the unfiltered list is not counted"
    assert abs(listing["cl"].result_count - ROWS) < ROWS * 0.05
    assert len(listing["cl"].result_list) == 50
    summary = listing["inbox_summary"]
    assert summary["completed_estimated"], "the summary counted a million completed rows"
    counted = {cell["status"]: 0 for cell in summary["rows"][0]["cells"]}
    for row in summary["rows"]:
        for cell in row["cells"]:
            counted[cell["status"]] += cell["count"] or 0
    assert counted["dead"] == dead
    assert counted["completed"] == 0  # estimated: shown as "~", never counted

    dead_list = visits["dead"].response.context["cl"]
    assert dead_list.result_count == dead <= COUNT_CAP
    assert not dead_list.count_is_estimate
    assert {row.status for row in dead_list.result_list} == {"dead"}
    newest = InboxMessage.objects.filter(status="dead").order_by("-updated_at", "-pk")[:50]
    assert [row.pk for row in dead_list.result_list] == [row.pk for row in newest]

    completed = visits["completed"].response.context["cl"]
    assert completed.count_is_estimate and completed.result_count == COUNT_CAP + 1

    search = visits["search"].response.context["cl"]
    assert [row.message_id for row in search.result_list] == [found.message_id]

    page_50 = visits["page_50"].response.context["cl"]
    assert page_50.page_num == 50
    top = InboxMessage.objects.order_by("-pk").values_list("pk", flat=True)[49 * 50 : 50 * 50]
    assert [row.pk for row in page_50.result_list] == list(top)

    assert found.message_id in visits["detail"].response.content.decode()
    print(f"test run {time.perf_counter() - began:.1f} s")
