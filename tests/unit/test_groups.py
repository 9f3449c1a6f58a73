"""Failure groups (``django_inbox.services.groups``, ``inbox_stats --groups``, ``inbox_replay
--group``): dead, parked and failed rows grouped by exception and masked message, and one
group replayed alone."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import Count
from django.utils import timezone

from django_inbox import deliver
from django_inbox.models import InboxMessage
from django_inbox.services import failure_groups, group_pks, replay, select
from django_inbox.services.groups import cause, group_id

Status = InboxMessage.Status


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("Reject: order ORD-20391 not found", "Reject: order ORD-77 not found"),
        ("KeyError: 'sku'", "KeyError: 'price'"),
        ('ValueError: bad value "x-1" for field "qty"', 'ValueError: bad value "" for field "n"'),
        (
            "OperationalError: connection to 10.0.0.5:5432 refused",
            "OperationalError: connection to 192.168.1.20:6432 refused",
        ),
        ("Error: no route to [fe80::1]:80", "Error: no route to [2001:db8::2]:8080"),
        ("Park: alice@example.com opted out", "Park: bob.smith+x@mail.example.org opted out"),
        (
            "HTTPError: 503 from https://api.example.com/v1/charges/ch_123?x=1",
            "HTTPError: 503 from http://10.1.1.1/other",
        ),
        (
            "LookupError: customer 0b7a3a4e-9a6f-4c1b-8f1e-3f2a1b0c9d8e gone",
            "LookupError: customer 11111111-2222-4333-8444-555555555555 gone",
        ),
        (
            "LateCopy: completed on 2026-11-20 10:00:01+00:00, purged on 2026-11-21T03:00:00Z",
            "LateCopy: completed on 2026-01-02 23:59:59.123456+00:00, purged on 2026-02-01",
        ),
        ("Timeout: after 30.5 s (attempt 3)", "Timeout: after 2 s (attempt 12)"),
        ("RuntimeError: evt_1Nx9aZ failed", "RuntimeError: evt_Zq82Lm failed"),
        ("Reject: order ORD-1 not found", "Reject: order ORD-123456789 not found"),
        ("Error: digest deadbeef01 wrong", "Error: digest 0x7f3a wrong"),
        ("RuntimeError:   spaces\n\tand lines", "RuntimeError: spaces and lines"),
    ],
)
def test_what_varies_between_rows_of_one_cause_is_masked(one: str, other: str) -> None:
    assert cause(one) == cause(other)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("KeyError: 'sku'", "ValueError: 'sku'"),  # another exception
        ("Reject: order not found", "Reject: customer not found"),  # another message
        ("Reject: stock below zero", "Reject: stock above limit"),
        ("ValueError: 'x' is not a number", "ValueError: 'x' is not a date"),
    ],
)
def test_different_causes_stay_apart(one: str, other: str) -> None:
    assert cause(one) != cause(other)


def test_a_message_without_an_exception_class_and_a_class_without_a_message() -> None:
    assert cause("parked by erin@host (admin): waiting for the supplier") == (
        "",
        "parked by <email> (admin): waiting for the supplier",
    )
    assert cause("LeaseExpired") == ("LeaseExpired", "")
    assert cause("") == ("", "")


def test_an_id_is_the_same_for_the_same_cause_and_differs_by_consumer() -> None:
    assert group_id("orders", "Reject", "x <num>") == group_id("orders", "Reject", "x <num>")
    assert group_id("orders", "Reject", "x <num>") != group_id("payments", "Reject", "x <num>")
    assert len(group_id("orders", "", "")) == 12


def _three_causes() -> None:
    """6 rejected orders (dead), 4 customers who opted out (parked), 5 refused connections
    (failed, to be retried), and one rejected order of another consumer."""

    def send(consumer: str, message_id: str, **payload: str) -> None:
        deliver(
            consumer=consumer, message_id=message_id, event_type="effect.write", payload=payload
        )

    for n in range(6):
        send("effects", f"rej-{n}", reject=f"order ORD-{1000 + n * 37} not found in 'east-{n}'")
    for n in range(4):
        send("effects", f"park-{n}", park=f"customer user{n}@example.com opted out")
    for n in range(5):
        send("effects", f"conn-{n}", fail_text=f"connection to 10.0.0.{n}:5432 refused after {n} s")
    send("stream", "rej-x", reject="order ORD-1 not found in 'west'")


@pytest.mark.django_db(transaction=True)
def test_rows_from_three_causes_make_three_groups_per_consumer() -> None:
    _three_causes()

    groups = failure_groups()

    summary = [(g.consumer, g.exception, g.pattern, g.count, g.statuses) for g in groups]
    assert summary == [
        ("effects", "Reject", "order <id> not found in <str>", 6, {"dead": 6}),
        ("effects", "RuntimeError", "connection to <ip> refused after <num> s", 5, {"failed": 5}),
        ("effects", "Park", "customer <email> opted out", 4, {"parked": 4}),
        ("stream", "Reject", "order <id> not found in <str>", 1, {"dead": 1}),
    ]
    rejected = groups[0]
    newest = InboxMessage.objects.filter(message_id__startswith="rej-", consumer="effects")
    assert rejected.sample_message_id == newest.latest("updated_at", "pk").message_id
    assert rejected.first_seen == min(row.updated_at for row in newest)
    assert rejected.last_seen == max(row.updated_at for row in newest)
    assert rejected.id == group_id("effects", "Reject", "order <id> not found in <str>")
    assert [g.id for g in failure_groups(consumer="stream")] == [groups[3].id]
    assert sorted(group_pks(rejected.id)) == sorted(newest.values_list("pk", flat=True))


def _stats(*args: str) -> Any:
    out = StringIO()
    call_command("inbox_stats", "--groups", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_inbox_stats_lists_the_groups_as_text_and_json() -> None:
    assert _stats() == "no dead, parked or failed rows\n"
    _three_causes()

    data = json.loads(_stats("--json"))
    text = _stats()

    assert [g["count"] for g in data["groups"]] == [6, 5, 4, 1]
    first = data["groups"][0]
    assert {"id", "consumer", "exception", "pattern", "count", "first_seen", "last_seen",
            "sample_message_id"} <= set(first)  # fmt: skip
    assert first["pattern"] == "order <id> not found in <str>"
    assert first["id"] in text and "6 row(s) (dead 6)" in text
    assert text.rstrip().endswith("4 group(s), 16 row(s); replay one: inbox_replay --group ID")
    only = json.loads(_stats("--json", "--consumer", "stream"))
    assert [g["consumer"] for g in only["groups"]] == ["stream"]


def _replay(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("inbox_replay", *args, "--no-input", stdout=out, stderr=StringIO())
    except CommandError as exc:
        return exc.returncode, out.getvalue() + str(exc)
    return 0, out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_inbox_replay_group_replays_that_groups_rows_only() -> None:
    _three_causes()
    rejected, failing, parked, _other = failure_groups()

    assert _replay("--group", rejected.id, "--dry-run") == (
        0,
        "".join(
            f"{pk} effects rej-{n} (dead)\n" for n, pk in enumerate(group_pks(rejected.id))
        ) + "inbox_replay: would replay 6 row(s) (dead 6)\n",
    )  # fmt: skip
    assert InboxMessage.objects.filter(status=Status.DEAD).count() == 7

    code, out = _replay("--group", rejected.id, "--reason", "warehouse fixed")
    assert (code, out.splitlines()[-1]) == (0, "inbox_replay: replayed 6 row(s) (dead 6)")
    replayed = InboxMessage.objects.filter(consumer="effects", message_id__startswith="rej-")
    assert {row.status for row in replayed} == {Status.RECEIVED}
    assert all(row.history[-1]["reason"] == "warehouse fixed" for row in replayed)
    left = dict(InboxMessage.objects.exclude(pk__in=replayed).values_list("message_id", "status"))
    assert left == {
        **{f"park-{n}": Status.PARKED for n in range(4)},
        **{f"conn-{n}": Status.FAILED for n in range(5)},
        "rej-x": Status.DEAD,
    }

    # A group of failed rows: they retry on their own, so none is replayed.
    assert _replay("--group", failing.id)[1].splitlines()[-1] == "inbox_replay: replayed 0 row(s)"
    code, out = _replay("--group", "0123456789ab")
    assert code == 2 and "no failure group '0123456789ab'" in out
    code, out = _replay("--group", parked.id, "--consumer", "stream")
    assert (code, out.splitlines()[-1]) == (0, "inbox_replay: replayed 0 row(s)")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_ten_thousand_dead_rows_in_five_groups_and_one_replayed_alone() -> None:
    now = timezone.now()
    causes = [
        "Reject: order ORD-{n} not found",
        "KeyError: 'sku-{n}'",
        "OperationalError: connection to 10.0.{m}.{m}:5432 refused",
        "HTTPError: 502 from https://pay.example.com/charges/ch_{n}",
        "ValueError: amount {n}.{m} below minimum for customer c{n}@example.com",
    ]
    InboxMessage.objects.bulk_create(
        [
            InboxMessage(
                consumer="effects",
                message_id=f"bulk-{n}",
                event_type="effect.write",
                status=Status.DEAD,
                attempts=3,
                last_error=causes[n % 5].format(n=n, m=n % 250),
                updated_at=now - timedelta(seconds=n),
                next_attempt_at=None,
                payload={},
            )
            for n in range(10_000)
        ],
        batch_size=2000,
    )

    started = time.perf_counter()
    groups = failure_groups()
    took = time.perf_counter() - started

    print(f"10,000 dead rows grouped in {took:.3f} s")
    assert sorted(g.count for g in groups) == [2000] * 5
    assert len({g.id for g in groups}) == 5
    result = replay(select(pks=group_pks(groups[0].id)), actor="test", via="test")
    assert result.total == 2000
    counts = dict(InboxMessage.objects.values_list("status").annotate(n=Count("pk")))
    assert counts == {Status.RECEIVED: 2000, Status.DEAD: 8000}
    assert [g.count for g in failure_groups()] == [2000] * 4
