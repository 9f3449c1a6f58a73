"""The outbox admin's replay of dead rows, as the inbox admin's actions are: a confirmation page
of its own, a required reason, one ``LogEntry`` per replayed row, behind its permission, with
counted messages. Driven through Django's test ``Client``."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from django_inbox.outbox import publish
from django_inbox.outbox.models import OutboxMessage
from tests.unit.test_admin import as_post, form_with, html, is_confirmation

pytestmark = pytest.mark.django_db(transaction=True)
Status = OutboxMessage.Status
CHANGELIST = "/admin/django_inbox_outbox/outboxmessage/"


def rows(n: int, **changes: Any) -> list[int]:
    ids = [publish("order.placed", {"n": i}, routing_key="orders") for i in range(n)]
    chosen = OutboxMessage.objects.filter(message_id__in=ids)
    chosen.update(**changes)
    return sorted(chosen.values_list("pk", flat=True))


def operator(*codenames: str) -> Client:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="django_inbox_outbox",
            codename__in=["view_outboxmessage", *codenames],
        )
    )
    client = Client()
    client.force_login(user)
    return client


def snapshot() -> list[tuple[Any, ...]]:
    return list(OutboxMessage.objects.order_by("pk").values_list("pk", "status", "attempts"))


def said(client: Client, response: Any) -> list[str]:
    """The messages the page after ``response`` (a redirect) shows."""
    assert response.status_code == 302, response.status_code
    return [str(message) for message in client.get(response["Location"]).context["messages"]]


def entries() -> Any:
    return LogEntry.objects.filter(
        content_type=ContentType.objects.get_for_model(OutboxMessage)
    ).order_by("object_id")


def test_the_replay_is_confirmed_with_a_reason_and_audited_per_row() -> None:
    dead = rows(2, status=Status.DEAD, attempts=10, last_error="unroutable: no queue")
    sent = rows(1, status=Status.SENT)
    held = [publish("order.placed", {"n": n}, routing_key="orders", key="order-9") for n in (1, 2)]
    OutboxMessage.objects.filter(message_id__in=held).update(status=Status.DEAD)
    keyed = sorted(OutboxMessage.objects.filter(key="order-9").values_list("pk", flat=True))
    client = operator("replay_outboxmessage")
    before = snapshot()
    selected = [*dead, *sent, *keyed]

    first = client.post(CHANGELIST, {"action": "replay_dead", "_selected_action": selected})
    assert first.status_code == 200 and is_confirmation(first), first.status_code
    assert snapshot() == before, "the confirmation page changes nothing"
    page = html(first)
    assert "Replay dead outbox messages" in page and "A reason is required" in page
    assert "<strong>4</strong> selected messages can be changed (from dead); 1 will" in page
    form = form_with(page, "confirm", "yes")
    assert sorted(map(int, as_post(form)["_selected_action"])) == sorted(selected)

    without = client.post(CHANGELIST, as_post(form, reason="  "))
    assert is_confirmation(without) and "a reason is required" in html(without)
    assert snapshot() == before and not entries().exists()

    done = client.post(CHANGELIST, as_post(form, reason="queue created (OPS-12)"))
    assert said(client, done) == [
        "Replayed 4 outbox messages (4 dead). A relay publishes them again with the same "
        "message id.",
        "Left unchanged: 1 sent (not dead).",
    ]
    statuses = dict(OutboxMessage.objects.values_list("pk", "status"))
    assert {pk: statuses[pk] for pk in [*dead, *keyed]} == dict.fromkeys([*dead, *keyed], "pending")
    assert OutboxMessage.objects.get(pk=keyed[1]).next_attempt_at is None  # held behind keyed[0]
    logged = list(entries())
    assert [int(e.object_id) for e in logged] == sorted([*dead, *keyed])
    for entry in logged:
        row = OutboxMessage.objects.get(pk=entry.object_id)
        assert entry.action_flag == CHANGE and entry.user.username == "ops"
        assert entry.change_message == "Replayed (was dead). Reason: queue created (OPS-12)"
        assert entry.object_repr == f"order.placed:{row.message_id}"

    again = client.post(CHANGELIST, as_post(form, reason="twice"))
    assert said(client, again) == [
        "Replayed no outbox message.",
        "Left unchanged: 4 pending (not dead); 1 sent (not dead).",
    ]
    one = rows(1, status=Status.DEAD)
    form = form_with(
        html(client.post(CHANGELIST, {"action": "replay_dead", "_selected_action": one})),
        "confirm",
        "yes",
    )
    done = client.post(CHANGELIST, as_post(form, reason="one"))
    assert said(client, done)[0].startswith("Replayed 1 outbox message (1 dead).")


def test_the_replay_needs_its_permission_even_forged() -> None:
    dead = rows(1, status=Status.DEAD)
    client = operator()  # may view, not replay
    assert "replay_dead" not in html(client.get(CHANGELIST))
    before = snapshot()
    forged = {
        "action": "replay_dead", "_selected_action": dead, "index": "0", "confirm": "yes",
        "reason": "forged",
    }  # fmt: skip
    response = client.post(CHANGELIST, forged)
    assert not is_confirmation(response)
    assert snapshot() == before and not entries().exists()


def test_a_stored_value_no_process_can_decode_shows_as_its_text() -> None:
    """The detail page showed it as a JSON string, which read like a payload that is text."""
    from django.db import connection

    pk = rows(1)[0]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {OutboxMessage._meta.db_table} SET payload = %s WHERE id = %s",
            ['{"a": ' + "9" * 5000 + "}", pk],
        )
    client = operator("view_payload_outboxmessage")
    page = html(client.get(f"{CHANGELIST}{pk}/change/"))
    assert "Shown as stored: holding a number with more digits" in page
    assert "{&quot;a&quot;: 999" in page


def test_a_reason_the_database_cannot_store_is_refused_before_anything_changes() -> None:
    """A NUL in the reason answered 500 once the rows were replayed, and nothing was audited."""
    dead = rows(1, status=Status.DEAD)
    client = operator("replay_outboxmessage")
    before = snapshot()
    page = html(client.post(CHANGELIST, {"action": "replay_dead", "_selected_action": dead}))
    form = form_with(page, "confirm", "yes")

    refused = client.post(CHANGELIST, as_post(form, reason="broken\x00reason"))

    assert refused.status_code == 200 and is_confirmation(refused)
    assert "cannot store (a NUL)" in html(refused)
    assert snapshot() == before and not entries().exists()
