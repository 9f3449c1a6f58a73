"""The outbox's operator side without a broker: stats and problems, the purge, the admin's
list and replay of dead rows, the command's refusals, and publish() suppressed in re-runs."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_inbox import deliver
from django_inbox.models import InboxMessage
from django_inbox.outbox import publish
from django_inbox.outbox import rows as relay_rows
from django_inbox.outbox.models import OutboxMessage
from django_inbox.services import collect, operator, select
from django_inbox.worker import Worker
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


def test_the_admin_lists_rows_and_replays_dead_ones_with_their_message_id() -> None:
    dead = rows(2, status=Status.DEAD, attempts=10, last_error="unroutable: no queue")
    rows(1)
    keyed("order-9", 2)  # the second is held behind the first
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_outboxmessage", "replay_outboxmessage"])
    )
    client = Client()
    client.force_login(user)
    page = client.get(CHANGELIST)
    assert page.status_code == 200
    assert "unroutable: no queue" in page.content.decode()
    assert page.content.decode().count("held: an earlier message of its key") == 1
    detail = client.get(f"{CHANGELIST}{OutboxMessage.objects.first().pk}/change/")
    assert detail.status_code == 200 and "&quot;n&quot;" not in detail.content.decode()
    selected = list(OutboxMessage.objects.exclude(key="order-9").values_list("pk", flat=True))
    done = client.post(CHANGELIST, {"action": "replay_dead", "_selected_action": selected})
    assert done.status_code == 302
    replayed = OutboxMessage.objects.filter(message_id__in=dead)
    assert set(replayed.values_list("status", "attempts")) == {(Status.PENDING, 0)}


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
    from django_inbox import InvalidField, PayloadTooLarge

    with pytest.raises(InvalidField, match="bytes of UTF-8"):
        publish("t", {}, routing_key="é" * 200)
    with pytest.raises(InvalidField, match="bytes of UTF-8"):
        publish("t", {}, routing_key="q", exchange="é" * 200)
    with pytest.raises(InvalidField, match="header name"):
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


def keyed(key: str, n: int) -> list[str]:
    ids = [publish("order.placed", {"n": i}, routing_key="orders", key=key) for i in range(n)]
    return [i for i in ids if i is not None]


def due_rows(key: str) -> list[str]:
    return list(
        OutboxMessage.objects.filter(key=key, status=Status.PENDING, next_attempt_at__isnull=False)
        .order_by("pk")
        .values_list("message_id", flat=True)
    )


def test_a_keys_later_rows_are_held_until_the_one_before_is_settled() -> None:
    first, second, third = keyed("order-1", 3)
    other = keyed("order-2", 1)
    assert due_rows("order-1") == [first] and due_rows("order-2") == other
    lease, claimed = relay_rows.claim(10, "default")
    assert sorted(row.message_id for row in claimed) == sorted([first, *other])
    pks = {row.message_id: row.pk for row in claimed}
    relay_rows.mark_sent([pks[first]], lease, "default", keys=["order-1"])
    assert due_rows("order-1") == [second]  # released by the mark, the third still held
    lease, claimed = relay_rows.claim(10, "default")
    assert [row.message_id for row in claimed] == [second]
    with override_settings(INBOX_OUTBOX_MAX_ATTEMPTS=1):
        assert relay_rows.fail(claimed[0], lease, "refused", "default") == Status.DEAD
    assert due_rows("order-1") == [third]  # a dead row holds its key back no longer


def test_a_claim_reads_a_hot_keys_head_only_however_long_its_backlog() -> None:
    hot = keyed("hot", 400)
    others = [keyed(f"cold-{i}", 1)[0] for i in range(5)]
    assert due_rows("hot") == hot[:1]
    if connection.vendor == "postgresql":
        # With statistics saying one key fills the table, a claim still reads a handful of
        # index entries: the due rows, and one key-index entry per keyed due row. (Before
        # rows were held it walked the hot key's 399 later rows; with a plain NOT EXISTS,
        # PostgreSQL checked the hot key's head by a scan of the whole table.)
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {OutboxMessage._meta.db_table}")
        with CaptureQueriesContext(connection) as queries:
            _, claimed = relay_rows.claim(100, "default")
        claim_sql = next(q["sql"] for q in queries if "SKIP LOCKED" in q["sql"])
        OutboxMessage.objects.update(locked_until=None)
        with connection.cursor() as cursor, transaction.atomic():
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + claim_sql)
            plan = cursor.fetchone()[0]
        read = _rows_read(plan[0]["Plan"])
        assert 0 < read <= 60, json.dumps(plan, indent=1)
    else:
        _, claimed = relay_rows.claim(100, "default")
    assert sorted(row.message_id for row in claimed) == sorted([hot[0], *others])


def _rows_read(node: dict[str, Any]) -> int:
    """Rows the scans of a plan read (kept or filtered out), over all their loops."""
    read = 0
    if "Scan" in node["Node Type"]:
        kept = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        read = kept * node.get("Actual Loops", 1)
    return read + sum(_rows_read(child) for child in node.get("Plans", []))


def test_a_row_held_behind_a_row_sent_before_it_committed_is_released_by_the_sweep() -> None:
    first, second = keyed("order-1", 2)
    # The race: the relay marked the first sent before the transaction writing the second
    # committed, so its release did not see it. Nothing else makes the second due.
    OutboxMessage.objects.filter(message_id=first).update(status=Status.SENT)
    blocked, _behind = keyed("order-2", 2)
    assert due_rows("order-1") == []
    assert relay_rows.sweep("default") == 1
    assert due_rows("order-1") == [second]
    assert due_rows("order-2") == [blocked]  # still behind a pending row: left held
    assert relay_rows.sweep("default") == 0
