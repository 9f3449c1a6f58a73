"""What the admin shows first, through Django's test client: the cause and the next attempt in
the list, attempts out of the maximum, one time style with seconds and the zone, who parked a
parked message, notices for parked and waiting rows, and a replay from a message's page that
names the message and returns to it. ``tests/system/test_admin_browser.py`` checks the layout
in Chromium at 1400 px."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from django_inbox.admin.columns import parked_by, shortened, when_text
from django_inbox.models import InboxMessage
from tests.unit.test_admin import (
    CHANGELIST,
    change_url,
    form_with,
    html,
    login,
    make_row,
    make_user,
)

Status = InboxMessage.Status
TIME = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\b")

pytestmark = pytest.mark.django_db


def cells(page: str, pk: int) -> dict[str, str]:
    """The text of each column of a row of the changelist, by the column's field name."""
    row = re.search(
        rf'<tr>\s*<td class="action-checkbox"><input [^>]*value="{pk}".*?</tr>', page, re.S
    )
    assert row, f"row {pk} is not in the list"
    found = {}
    for field, content in re.findall(
        r'<t[hd] class="field-(\w+)[^"]*"[^>]*>(.*?)</t[hd]>', row.group(0), re.S
    ):
        found[field] = re.sub(r"<[^>]+>", "", content).strip()
    return found


def test_the_list_shows_the_cause_the_next_attempt_and_attempts_of_the_maximum() -> None:
    error = (
        "ConnectionError: the warehouse API at https://warehouse.internal/v2/stock timed out "
        "after 30 s while reserving stock for order 3001 and will be retried"
    )
    due = timezone.now() + timedelta(minutes=5)
    failed = make_row(Status.FAILED, last_error=error, attempts=2, next_attempt_at=due)
    dead = make_row(Status.DEAD, last_error="ValueError: sku unknown", attempts=5)
    client = login(make_user("superuser"))  # may see payloads, and so error messages
    page = html(client.get(CHANGELIST))

    row = cells(page, failed.pk)
    assert list(row) == [
        "message_id",
        "consumer",
        "event_type",
        "status_display",
        "attempts_display",
        "short_error",
        "next_attempt_display",
    ]
    assert row["attempts_display"] == "2 of 3"  # the effects consumer: INBOX_MAX_ATTEMPTS 3
    assert row["short_error"] == shortened(error) and row["short_error"].endswith("…")
    assert row["short_error"].split()[-1].rstrip("…") in error.split()  # a whole word
    assert f'title="{error}"' in page.replace("&#x27;", "'")  # the whole error, on hover
    assert row["next_attempt_display"] == when_text(due) and TIME.fullmatch(when_text(due))
    assert cells(page, dead.pk)["next_attempt_display"] == "-"  # dead: no attempt to come
    assert cells(page, dead.pk)["attempts_display"] == "5 of 3"

    # A user who may not see payloads sees the exception's class only (messages quote them).
    viewer = html(login(make_user("operator")).get(CHANGELIST))
    assert cells(viewer, failed.pk)["last_error_type"] == "ConnectionError"
    assert "warehouse" not in viewer


def test_one_time_style_in_list_detail_and_timeline() -> None:
    row = make_row(Status.DEAD, received_at=datetime(2026, 3, 1, 12, 30, 5, tzinfo=UTC))
    assert when_text(row.received_at) == "2026-03-01 12:30:05 UTC"
    # An aware time in another zone is shown in UTC.
    other = datetime(2026, 3, 1, 14, 30, 5, tzinfo=timezone.get_fixed_timezone(120))
    assert when_text(other) == "2026-03-01 12:30:05 UTC"
    page = html(login(make_user("operator")).get(change_url(row.pk)))
    assert "2026-03-01 12:30:05 UTC" in page  # the received field and the timeline's first line
    assert "3 of 3" in page
    assert not re.search(r"\b(a\.m\.|p\.m\.)", page), "Django's localized format crept back"


def test_shortened_cuts_at_a_word_and_keeps_short_text() -> None:
    assert shortened("RuntimeError: down") == "RuntimeError: down"
    assert shortened("a   b\n c") == "a b c"
    cut = shortened("word " * 40, limit=30)
    assert len(cut) <= 30 and cut.endswith("word…")
    assert shortened("x" * 200, limit=30) == "x" * 29 + "…"  # one long token: cut inside it


def test_a_parked_message_says_who_parked_it_and_why() -> None:
    now = timezone.now().isoformat()
    by_operator = make_row(
        Status.PARKED,
        history=[
            {"kind": "error", "type": "RuntimeError", "message": "down", "outcome": "dead"},
            {
                "kind": "park",
                "at": now,
                "by": "ana (admin user 7)",
                "via": "admin",
                "from": "dead",
                "attempts": 3,
                "reason": "waiting for the supplier",
            },
        ],
    )
    by_handler = make_row(
        Status.PARKED,
        last_error="Park: card 4242 needs review",
        history=[
            {
                "kind": "error",
                "at": now,
                "type": "Park",
                "message": "card 4242 needs review",
                "outcome": "parked",
            }
        ],
    )
    assert parked_by(by_operator) == (
        "an operator, ana (admin user 7) via admin: “waiting for the supplier”"
    )
    assert parked_by(by_handler) == "its handler (Park: card 4242 needs review)"
    assert parked_by(by_handler, errors=False) == "its handler (Park)"

    operator = login(make_user("superuser"))
    page = html(operator.get(change_url(by_operator.pk)))
    assert "Parked by" in page or "parked by" in page
    assert "waiting for the supplier" in page
    viewer = html(login(make_user("viewer")).get(change_url(by_handler.pk)))
    assert "its handler (Park)" in viewer and "4242" not in viewer
    # A row that is not parked has no such line.
    assert "parked by" not in html(operator.get(change_url(make_row(Status.DEAD).pk))).lower()


def test_notices_name_parked_and_waiting_rows_and_idle_consumers_fold_away() -> None:
    make_row(Status.PARKED)
    make_row(Status.WAITING, consumer="ordered", key="case-1", sequence=3)
    client = login(make_user("viewer"))
    page = html(client.get(CHANGELIST))
    notices = re.search(r'<ul class="inbox-notices" id="inbox-notices">(.*?)</ul>', page, re.S)
    assert notices
    text = re.sub(r"<[^>]+>", " ", notices.group(1))
    assert "effects: 1 parked, waiting for an operator" in text
    assert "ordered: 1 version(s) waiting for an earlier one" in text
    assert "?consumer=effects&amp;status__exact=parked" in notices.group(1)
    summary = client.get(CHANGELIST).context["inbox_summary"]
    shown = [row["consumer"] for row in summary["rows"]]
    assert shown == ["effects", "ordered"]
    assert "audit" in [row["consumer"] for row in summary["quiet"]]
    # An ordered consumer is shown: its statuses' columns are there.
    assert "waiting" in [status for status, _label in summary["statuses"]]


def test_replay_from_a_message_page_names_it_and_returns_to_it() -> None:
    row = make_row(Status.DEAD, message_id="order-3001")
    other = make_row(Status.DEAD, message_id="order-3002")
    client = login(make_user("operator"))
    form = form_with(html(client.get(change_url(row.pk))), "action", "replay_messages")
    fields = dict(form["fields"])
    assert fields["_return_to"] == str(row.pk)
    confirmation = html(client.post(CHANGELIST, fields))
    assert re.search(r'id="inbox-sample">.*effects · order-3001', confirmation, re.S)
    assert "order-3002" not in confirmation
    assert f'href="{change_url(row.pk)}" class="button cancel-link"' in confirmation
    done = client.post(
        CHANGELIST, {**fields, "confirm": "yes", "reason": "supplier fixed", "_return_to": row.pk}
    )
    assert done.status_code == 302 and done["Location"] == change_url(row.pk)
    row.refresh_from_db()
    assert row.status == Status.RECEIVED

    # A _return_to that is not the selected message is ignored: back to the list.
    forged = client.post(
        CHANGELIST,
        {
            "action": "replay_messages",
            "_selected_action": [other.pk],
            "confirm": "yes",
            "reason": "x",
            "_return_to": row.pk,
        },
    )
    assert forged.status_code == 302 and forged["Location"] != change_url(row.pk)


def test_a_large_selection_names_a_sample_and_counts_the_rest() -> None:
    rows = [make_row(Status.DEAD, message_id=f"dead-{n:02d}") for n in range(14)]
    client = login(make_user("operator"))
    page = html(
        client.post(
            CHANGELIST,
            {
                "action": "replay_messages",
                "select_across": "1",
                "index": "0",
                "_selected_action": [rows[0].pk],
            },
        )
    )
    sample = re.search(r'<ul id="inbox-sample">(.*?)</ul>', page, re.S)
    assert sample
    named = re.findall(r"dead-\d\d", sample.group(1))
    assert len(named) == 10 and len(set(named)) == 10  # ten of them, newest first among them
    assert named == sorted(named, reverse=True)
    assert "and the others" in sample.group(1) and "14" in sample.group(1)
