"""The admin's failure groups: the page lists the groups, a group's link shows its rows only,
and the replay action with "select all" on those rows replays that group alone, confirmed and
audited (``LogEntry``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse

from django_inbox.models import InboxMessage
from django_inbox.services import failure_groups
from tests.unit.test_admin import CHANGELIST, html, login, make_row, make_user, result_pks

Status = InboxMessage.Status
GROUPS = "/admin/django_inbox/inboxmessage/groups/"


def _rows() -> dict[str, list[InboxMessage]]:
    return {
        "missing": [
            make_row(Status.DEAD, f"m-{n}", last_error=f"Reject: order ORD-{n * 7} not found")
            for n in range(5)
        ],
        "refused": [
            make_row(
                Status.FAILED,
                f"r-{n}",
                last_error=f"OperationalError: connection to 10.0.0.{n}:5432 refused",
            )
            for n in range(3)
        ],
        "opted": [
            make_row(Status.PARKED, f"o-{n}", last_error=f"Park: user{n}@example.com opted out")
            for n in range(2)
        ],
    }


@pytest.mark.django_db
def test_the_groups_page_lists_each_cause_with_its_rows_and_its_newest_row() -> None:
    rows = _rows()
    client = login(make_user("superuser"))

    response = client.get(GROUPS)

    assert response.status_code == 200
    page = html(response)
    groups = failure_groups()
    assert [g.count for g in groups] == [5, 3, 2]
    for group in groups:
        row = re.search(rf'<tr id="group-{group.id}">.*?</tr>', page, re.S)
        assert row, group
        assert f"?consumer=effects&amp;group={group.id}" in row.group(0)
        assert group.pattern.replace("<", "&lt;").replace(">", "&gt;") in row.group(0)
        assert group.sample_message_id in row.group(0)
    assert "3 groups, 10 dead, parked or failed rows" in page
    newest = rows["missing"][-1]
    assert reverse("admin:django_inbox_inboxmessage_change", args=[newest.pk]) in page


@pytest.mark.django_db
def test_the_groups_page_needs_the_view_permission() -> None:
    _rows()
    assert login(make_user("staff")).get(GROUPS).status_code == 403
    assert login(make_user("viewer")).get(GROUPS).status_code == 200


@pytest.mark.django_db
def test_a_group_larger_than_the_changelist_takes_is_listed_in_part_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_inbox.admin import groups

    rows = _rows()
    monkeypatch.setattr(groups, "MAX_GROUP_ROWS", 3)
    missing = next(g for g in failure_groups() if g.exception == "Reject")
    client = login(make_user("superuser"))

    listed = client.get(f"{CHANGELIST}?consumer=effects&group={missing.id}")

    assert result_pks(listed) == {row.pk for row in rows["missing"][:3]}
    assert "Only the first 3 rows of this group are listed" in html(listed)


@pytest.mark.django_db(transaction=True)
def test_a_groups_rows_replayed_with_select_all_are_that_group_only_and_audited() -> None:
    rows = _rows()
    missing = next(g for g in failure_groups() if g.exception == "Reject")
    user = make_user("superuser")
    client = login(user)

    listed = client.get(f"{CHANGELIST}?group={missing.id}")
    assert result_pks(listed) == {row.pk for row in rows["missing"]}

    response = client.post(
        f"{CHANGELIST}?group={missing.id}",
        {
            "action": "replay_messages",
            "select_across": "1",
            "index": "0",
            "_selected_action": [rows["missing"][0].pk],
            "confirm": "yes",
            "reason": "orders backfilled",
        },
    )

    assert response.status_code == 302, html(response)[:2000]
    statuses: dict[str, Any] = dict(InboxMessage.objects.values_list("message_id", "status"))
    assert {k for k, v in statuses.items() if v == Status.RECEIVED} == {
        row.message_id for row in rows["missing"]
    }
    assert LogEntry.objects.filter(user=user).count() == len(rows["missing"])
    assert [g.count for g in failure_groups()] == [3, 2]
