"""The outbox's operator side without a broker: stats and problems, the purge, the admin's
list and replay of dead rows, the command's refusals, and publish() suppressed in re-runs."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone

from django_inbox import deliver
from django_inbox.models import InboxMessage
from django_inbox.outbox import publish
from django_inbox.outbox.held import holds_rows
from django_inbox.outbox.models import OutboxMessage
from django_inbox.processing.worker import Worker
from django_inbox.services import collect, operator, select
from tests.conftest import handler

pytestmark = pytest.mark.django_db(transaction=True)
Status = OutboxMessage.Status
CHANGELIST = "/admin/django_inbox_outbox/outboxmessage/"


def rows(n: int, **changes: Any) -> list[str]:
    ids = [publish("order.placed", {"n": i}, routing_key="orders") for i in range(n)]
    if changes:
        OutboxMessage.objects.filter(message_id__in=ids).update(**changes)
    return [i for i in ids if i is not None]


def test_stats_count_the_outbox_and_report_dead_rows_and_lag() -> None:
    rows(3)
    rows(2, status=Status.DEAD, last_error="unroutable")
    rows(1, status=Status.SENT, sent_at=timezone.now())
    OutboxMessage.objects.filter(status=Status.PENDING).update(
        created_at=timezone.now() - timedelta(minutes=30)
    )
    stats = collect(max_pending_age=60)
    assert (stats.outbox.pending, stats.outbox.dead, stats.outbox.sent) == (3, 2, 1)
    assert stats.outbox.oldest_pending_age >= 1800
    kinds = {problem.kind for problem in stats.problems}
    assert {"outbox_dead", "outbox_lag"} <= kinds
    assert stats.as_dict()["outbox"]["pending"] == 3
    assert not {"outbox_dead", "outbox_lag"} & {
        p.kind for p in collect(max_pending_age=60, ignore=("outbox_dead", "outbox_lag")).problems
    }


def test_stats_say_relays_are_behind_when_they_send_and_old_rows_wait() -> None:
    """Rows sent a moment ago: relays run; the lag is a backlog, with the latest failure."""
    rows(1, status=Status.SENT, sent_at=timezone.now() - timedelta(seconds=5))
    old = timezone.now() - timedelta(minutes=30)
    due = timezone.now()
    rows(2, created_at=old, next_attempt_at=due + timedelta(seconds=1))
    (failing,) = rows(
        1, created_at=old, next_attempt_at=due, attempts=4,
        last_error="refused by the broker: NOT_FOUND", updated_at=timezone.now(),
    )  # fmt: skip
    stats = collect(max_pending_age=60)
    [lag] = [p.message for p in stats.problems if p.kind == "outbox_lag"]
    assert lag.startswith("the oldest pending outbox message was written 1800s ago (limit 60s): ")
    assert re.search(
        rf"relays are sending \(the last \d+s ago\) but are behind; the latest, attempt 4 of "
        rf"{failing} \d+s ago, failed: refused by the broker: NOT_FOUND$",
        lag,
    ), lag
    said = stats.as_dict()["outbox"]
    assert said["last_sent_age"] >= 5 and 0 <= said["unclaimed_for"] < 60
    assert said["last_failure"] == "refused by the broker: NOT_FOUND"


@pytest.mark.postgres
def test_stats_estimate_sent_rows_of_a_large_table_from_its_current_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner's estimate follows the table's growth since its last ``ANALYZE``;
    ``reltuples`` alone stays where that left it (here under the threshold, so the rows were
    counted, a scan of them all on a large table)."""

    from django_inbox.outbox import health
    from tests.plans import take_statistics

    def sent(first: int, last: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {OutboxMessage._meta.db_table} (message_id, event_type, payload, "
                "headers, exchange, routing_key, key, status, attempts, last_error, created_at, "
                "updated_at, lease_id, causation_consumer, causation_message_id, sent_at) "
                "SELECT 's-' || i, 'e', '{}', '{}', '', 'q', '', 'sent', 1, '', now(), now(), "
                f"'', '', '', now() FROM generate_series({first}, {last}) i"
            )

    monkeypatch.setattr(health, "ESTIMATE_ABOVE", 5000)
    sent(1, 2000)
    take_statistics(OutboxMessage._meta.db_table)
    sent(2001, 22000)
    stats = collect().outbox
    assert stats.sent_estimated and 15000 < stats.sent < 30000, stats


def test_inbox_stats_prints_the_outbox(capsys: Any) -> None:
    rows(2)
    with pytest.raises(CommandError):  # a pending row older than the limit is a problem
        OutboxMessage.objects.update(created_at=timezone.now() - timedelta(hours=2))
        call_command("inbox_stats")
    assert "outbox: 2 pending" in capsys.readouterr().out


def test_purge_outbox_deletes_old_sent_rows_only() -> None:
    old = timezone.now() - timedelta(days=8)
    rows(3, status=Status.SENT, sent_at=old)
    rows(2, status=Status.SENT, sent_at=timezone.now())
    rows(1, status=Status.DEAD)
    rows(1)
    call_command("inbox_purge", "--outbox", "--batch-size", "2")
    assert sorted(OutboxMessage.objects.values_list("status", flat=True)) == [
        "dead", "pending", "sent", "sent"
    ]  # fmt: skip
    with pytest.raises(CommandError, match="sent rows only"):
        call_command("inbox_purge", "--outbox", "--status", "dead")


def test_the_admin_lists_rows() -> None:
    rows(2, status=Status.DEAD, attempts=10, last_error="unroutable: no queue")
    rows(1)
    for n in range(2):  # the second is held behind the first
        publish("order.placed", {"n": n}, routing_key="orders", key="order-9")
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_outboxmessage", "replay_outboxmessage"])
    )
    client = Client()
    client.force_login(user)
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    # Without the payload permission, an error's kind only: its text may quote the payload.
    assert "unroutable" in page.content.decode()
    assert "no queue" not in page.content.decode()
    assert client.get(CHANGELIST, {"last_error__contains": "queue"}).status_code == 400
    held = 1 if holds_rows("default") else 0  # MySQL and MariaDB hold no rows
    assert page.content.decode().count("held: an earlier message of its key") == held
    detail = client.get(f"{CHANGELIST}{OutboxMessage.objects.first().pk}/change/")
    assert detail.status_code == 200 and "&quot;n&quot;" not in detail.content.decode()
    user.user_permissions.add(Permission.objects.get(codename="view_payload_outboxmessage"))
    client.force_login(User.objects.get(pk=user.pk))  # the permissions are cached on the user
    assert "unroutable: no queue" in client.get(CHANGELIST).content.decode()


def test_the_admin_shows_the_outbox_as_the_inbox_admin_does() -> None:
    """Badges, the destination, the summary with the problems, one time style, a timeline on
    a message's page and a link to the inbox message whose handler wrote it."""
    cause = InboxMessage.objects.create(
        consumer="effects", message_id="order-77", event_type="order.paid", payload={}
    )
    rows(2, status=Status.DEAD, attempts=10, last_error="unroutable: no queue")
    [sent] = rows(
        1,
        status=Status.SENT,
        attempts=2,
        sent_at=timezone.now(),
        exchange="shop",
        causation_consumer="effects",
        causation_message_id="order-77",
    )
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename="view_outboxmessage"))
    client = Client()
    client.force_login(user)
    page = client.get(CHANGELIST).content.decode()
    assert 'id="outbox-problems"' in page
    assert "2 outbox messages dead: not published after their attempts" in page
    assert re.search(r'<span class="inbox-status inbox-status-dead">✗ dead</span>', page)
    assert "(default exchange) → orders" in page and "shop → orders" in page
    summary = re.search(r'id="outbox-summary">(.*?)</table>', page, re.S)
    assert summary and 'status__exact=dead">2</a>' in summary.group(1)

    row = OutboxMessage.objects.get(message_id=sent)
    detail = client.get(f"{CHANGELIST}{row.pk}/change/").content.decode()
    timeline = re.search(r'<ol class="inbox-timeline">(.*?)</ol>', detail, re.S)
    assert timeline, detail[:2000]
    text = re.sub(r"<[^>]+>", "", timeline.group(1))
    assert "Written to shop → orders" in text
    assert "1 attempt(s) failed" in text and "Sent on attempt 2" in text
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text)
    link = f'href="/admin/django_inbox/inboxmessage/{cause.pk}/change/">effects · order-77</a>'
    assert link in detail
    cause.delete()
    assert (
        "effects · order-77 (no longer kept)"
        in client.get(f"{CHANGELIST}{row.pk}/change/").content.decode()
    )


def test_the_admin_does_not_offer_the_replay_without_its_permission() -> None:
    rows(1, status=Status.DEAD)
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_outboxmessage"))
    client = Client()
    client.force_login(user)
    assert "replay_dead" not in client.get(CHANGELIST).content.decode()


def test_the_relay_command_refuses_what_it_cannot_use() -> None:
    with pytest.raises(CommandError, match="not an AMQP URL"):
        call_command("outbox_relay", "--broker", "redis://127.0.0.1:6379/0")
    with pytest.raises(CommandError, match="batch-size"):
        call_command("outbox_relay", "--broker", "amqp://x", "--batch-size", "0")


def _publishing(message: Any) -> None:
    publish("receipt.due", {"order": message.payload["order"]}, routing_key="receipts")


def test_publish_is_a_side_effect_suppressed_in_a_suppressing_rerun() -> None:
    with handler("order.paid", "notify", _publishing):
        deliver(consumer="notify", message_id="p1", event_type="order.paid", payload={"order": 1})
        assert OutboxMessage.objects.count() == 1
        operator.replay(
            select(message_ids=["p1"], statuses=["completed"]), force=True, actor="ops",
            reason="rebuild",
        )  # fmt: skip
        Worker(["notify"], until_idle=0, poll_interval=0.01).run()
    assert OutboxMessage.objects.count() == 1  # the re-run published nothing
    row = InboxMessage.objects.get(message_id="p1")
    assert [(e["function"], e["calls"]) for e in row.history if e["kind"] == "suppressed"] == [
        ("django_inbox.outbox.publish", 1)
    ]


def test_publish_refuses_what_amqp_cannot_carry() -> None:
    from django_inbox import InvalidField, InvalidPayload, PayloadTooLarge

    with pytest.raises(InvalidField, match="bytes of UTF-8"):
        publish("t", {}, routing_key="é" * 200)
    with pytest.raises(InvalidField, match="bytes of UTF-8"):
        publish("t", {}, routing_key="q", exchange="é" * 200)
    with pytest.raises(InvalidPayload, match=r"header name 'hhh.* is 300 bytes"):
        publish("t", {}, routing_key="q", headers={"h" * 300: 1})
    with pytest.raises(PayloadTooLarge):
        publish("t", {}, routing_key="q", headers={"big": "x" * 70_000})
    assert not OutboxMessage.objects.exists()


def test_the_admin_refuses_payload_filters_without_the_permission_and_nul_in_filters() -> None:
    rows(1)
    OutboxMessage.objects.update(payload={"card": "4111"})
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_outboxmessage"))
    client = Client(raise_request_exception=False)
    client.force_login(user)
    probe = client.get(f"{CHANGELIST}?payload__card__startswith=4111")
    assert probe.status_code == 400  # refused (a disallowed lookup), not answered
    assert client.get(f"{CHANGELIST}?key=%00").status_code == 400


def test_the_outbox_settings_are_checked() -> None:
    from django.core.checks import run_checks

    def e018() -> int:  # registered by the outbox app: run with every other check
        return [e.id for e in run_checks()].count("django_inbox.E018")

    with override_settings(INBOX_OUTBOX_LEASE=10, INBOX_OUTBOX_CONFIRM_TIMEOUT=10):
        assert e018() == 1
    with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=0, INBOX_OUTBOX_BACKOFF_BASE="soon"):
        assert e018() == 2
    assert e018() == 0


def test_the_admins_search_filter_and_count_read_no_more_than_they_show() -> None:
    """Exact searches (Django's ``=field`` is ``UPPER(…) = UPPER(…)``, which no index
    answers), an event type filter over the newest rows (Django's reads every row for its
    ``DISTINCT``), and a capped count."""
    from django.test.utils import CaptureQueriesContext

    (placed,) = rows(1)
    publish("order.paid", {}, routing_key="orders", key="order-3")
    deliver(consumer="effects", message_id="cause-1", event_type="effect.write", payload={})
    OutboxMessage.objects.filter(key="order-3").update(causation_message_id="cause-1")
    client = Client()
    client.force_login(User.objects.create_superuser("root", "r@example.com", "pw"))

    def listed(query: str) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            page = client.get(f"{CHANGELIST}?{query}")
        assert page.status_code == 200
        sent = " ".join(q["sql"] for q in queries)
        assert "UPPER(" not in sent and "DISTINCT" not in sent, sent
        found = OutboxMessage.objects.filter(
            pk__in=[row.pk for row in page.context["cl"].result_list]
        )
        return sorted(found.values_list("event_type", flat=True))

    assert listed(f"q={placed}") == ["order.placed"]
    assert listed(f"q={placed.upper()}") == []  # exact: a message id is case-sensitive
    assert listed("q=key:order-3") == ["order.paid"]
    assert listed("q=cause:cause-1") == ["order.paid"]
    assert listed("event_type=order.paid") == ["order.paid"]
    with CaptureQueriesContext(connection) as queries:
        page = client.get(f"{CHANGELIST}?_facets=True")  # Django 5's "Show counts": refused
    assert not [q["sql"] for q in queries if "FILTER (WHERE" in q["sql"]]
    assert ">order.placed</a>" in page.content.decode()  # offered: among the newest rows
    assert "2 outbox messages" in page.content.decode()


@pytest.mark.postgres
def test_the_lag_diagnosis_reads_the_ends_of_indexes_not_the_backlog() -> None:
    """The last sent_at, the first due time and the rows due then, over a backlog of 20,000
    pending and 20,000 sent rows: each reads about what it returns, an end of an index; and
    the pending rows, more than 10,000, are counted up to 10,001 and estimated beyond."""
    from django.test.utils import CaptureQueriesContext

    from django_inbox.outbox.health import SAMPLE
    from django_inbox.outbox.health import collect as collect_outbox
    from tests.plans import explain, rows_read, take_statistics

    table = OutboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (message_id, event_type, payload, headers, exchange, "
            "routing_key, key, status, attempts, last_error, created_at, updated_at, "
            "next_attempt_at, lease_id, causation_consumer, causation_message_id, sent_at) "
            "SELECT 'm-' || i, 'e', '{}', '{}', '', 'q', '', CASE WHEN i % 2 = 0 THEN 'sent' "
            "ELSE 'pending' END, 1, 'unroutable', now() - interval '1 hour', now(), "
            "CASE WHEN i % 2 = 1 THEN now() - (i || ' seconds')::interval END, '', '', '', "
            "CASE WHEN i % 2 = 0 THEN now() END FROM generate_series(1, 40000) i"
        )
    take_statistics(table)
    with CaptureQueriesContext(connection) as queries:
        stats = collect_outbox()
    assert stats.pending_estimated is True and abs(stats.pending - 20000) < 2000
    assert stats.last_failure == "unroutable"
    bounded = [q["sql"] for q in queries if "LIMIT 10001" in q["sql"]]
    assert len(bounded) == 2, [q["sql"] for q in queries]  # the pending rows, the dead ones
    for sql in bounded:
        assert rows_read(explain(sql, analyze=True)) <= 10001, sql
    first_due = f'MIN("{table}"."next_attempt_at")'
    diagnosis = [
        q["sql"]
        for q in queries
        if 'MAX("' in q["sql"] or first_due in q["sql"] or q["sql"].endswith(f"LIMIT {SAMPLE}")
    ]
    assert len(diagnosis) == 3, [q["sql"] for q in queries]
    for sql in diagnosis:
        assert rows_read(explain(sql, analyze=True)) <= SAMPLE, sql
