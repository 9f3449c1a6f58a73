"""The inbox's Django admin, driven through Django's test ``Client`` (no browser).

Permissions: who sees which action, who can run it (through the confirmation page, with a
forged POST, without a CSRF token); every change is audited with one ``LogEntry`` per row and
a history entry naming the user. The admin never adds, edits or deletes rows. Everything a
message carries is escaped; payloads are hidden without their permission. Search, filters,
summary, banner and capped pagination. A 10,000-row select-across replay in one request, then
processed exactly once. ``INBOX_ADMIN = False`` leaves the model unregistered.
"""

from __future__ import annotations

import importlib
import itertools
import re
import time
import types
from datetime import timedelta
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.test import Client, override_settings
from django.urls import path, reverse
from django.utils import timezone
from effects.models import Effect

from django_inbox import history
from django_inbox.admin.options import ACTIONS, InboxMessageAdmin
from django_inbox.models import InboxMessage
from django_inbox.services import process_due
from tests.effects import lost_and_doubled

Status = InboxMessage.Status
CHANGELIST = "/admin/django_inbox/inboxmessage/"
XSS_SCRIPT = "<script>alert(1)</script>"
XSS_IMG = "<img src=x onerror=alert(1)>"

#: Permissions (codenames) of each role; ``None``: superuser.
ROLES: dict[str, list[str] | None] = {
    "staff": [],
    "viewer": ["view_inboxmessage"],
    "operator": [
        "view_inboxmessage",
        "replay_inboxmessage",
        "park_inboxmessage",
        "retry_inboxmessage",
    ],
    "superuser": None,
}
#: Actions each role may run.
ALLOWED: dict[str, set[str]] = {
    "staff": set(),
    "viewer": set(),
    "operator": {"replay_messages", "park_messages", "retry_messages_now"},
    "superuser": set(ACTIONS),
}
#: The status a row starts from for each action, and the history entry kind it appends.
STARTS = {
    "replay_messages": Status.DEAD,
    "force_rerun_messages": Status.COMPLETED,
    "park_messages": Status.RECEIVED,
    "retry_messages_now": Status.FAILED,
    "skip_versions": Status.DEAD,
}
#: What a row needs besides its status for each action (skip: a version of an ordered consumer).
FIELDS: dict[str, dict[str, Any]] = {
    "skip_versions": {
        "consumer": "ordered",
        "event_type": "ordered.apply",
        "key": "K",
        "sequence": 1,
    },
}
KINDS = {
    "replay_messages": "replay",
    "force_rerun_messages": "replay",
    "park_messages": "park",
    "retry_messages_now": "retry",
    "skip_versions": "skip",
}

_ids = itertools.count(1)


# --- helpers -------------------------------------------------------------------------------


def make_row(
    status: str = Status.DEAD,
    message_id: str | None = None,
    *,
    consumer: str = "effects",
    event_type: str = "effect.write",
    payload: Any = None,
    **fields: Any,
) -> InboxMessage:
    """One row as it looks in ``status`` (failed rows are due in an hour)."""
    now = timezone.now()
    values: dict[str, Any] = {
        "attempts": {"dead": 3, "failed": 1, "completed": 1}.get(status, 0),
        "next_attempt_at": {"received": now, "failed": now + timedelta(hours=1)}.get(status),
        "processed_at": now if status == Status.COMPLETED else None,
        "last_error": "RuntimeError: down" if status in ("dead", "failed") else "",
    }
    values.update(fields)
    return InboxMessage.objects.create(
        consumer=consumer,
        message_id=message_id or f"msg-{next(_ids)}",
        event_type=event_type,
        payload={} if payload is None else payload,
        status=status,
        **values,
    )


def snapshot() -> dict[int, tuple[Any, ...]]:
    """Everything an action may change, for every row."""
    return {
        row[0]: row[1:]
        for row in InboxMessage.objects.values_list(
            "pk",
            "status",
            "attempts",
            "next_attempt_at",
            "locked_until",
            "processed_at",
            "updated_at",
            "history",
        )
    }


def make_user(role: str, username: str | None = None) -> Any:
    User = get_user_model()
    username = username or role
    if ROLES[role] is None:
        return User.objects.create_superuser(username, f"{role}@example.com", "pw")
    user = User.objects.create_user(username, f"{role}@example.com", "pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_inbox", codename__in=ROLES[role])
    )
    return user


def login(user: Any, **client_options: Any) -> Client:
    client = Client(**client_options)
    client.force_login(user)
    return client


def change_url(pk: int) -> str:
    return reverse("admin:django_inbox_inboxmessage_change", args=[pk])


def html(response: Any) -> str:
    return response.content.decode()


def action_choices(page: str) -> set[str] | None:
    """Values of the changelist's action dropdown (``None``: no dropdown at all)."""
    select = re.search(r'<select name="action".*?</select>', page, re.S)
    if select is None:
        return None
    return set(re.findall(r'<option value="([^"]+)"', select.group(0)))


def is_confirmation(response: Any) -> bool:
    names = [t.name for t in getattr(response, "templates", []) or []]
    return "admin/django_inbox/inboxmessage/action_confirmation.html" in names


def result_pks(response: Any) -> set[int]:
    assert response.status_code == 200, response.status_code
    return {row.pk for row in response.context["cl"].result_list}


def paginator_line(page: str) -> str:
    found = re.search(r'<p class="paginator">(.*?)</p>', page, re.S)
    assert found, "no pagination line"
    return " ".join(re.sub(r"<[^>]+>", " ", found.group(1)).split())


class _Forms(HTMLParser):
    """The hidden inputs and textareas of each form of a page, as a browser would post them."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []
        self._form: dict[str, Any] | None = None
        self._textarea: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form":
            self._form = {"attrs": attributes, "fields": []}
            self.forms.append(self._form)
        elif self._form is not None and tag == "input" and attributes.get("type") == "hidden":
            self._form["fields"].append([attributes["name"], attributes.get("value") or ""])
        elif self._form is not None and tag == "textarea":
            self._textarea = [attributes["name"] or "", ""]
            self._form["fields"].append(self._textarea)

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._textarea[1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag == "textarea":
            self._textarea = None


def form_with(page: str, field: str, value: str | None = None) -> dict[str, Any]:
    """The form that has a field ``field`` (with ``value``, if given): attrs and fields."""
    parser = _Forms()
    parser.feed(page)
    for form in parser.forms:
        for name, found in form["fields"]:
            if name == field and (value is None or found == value):
                return form
    raise AssertionError(f"no form with a field {field}={value!r}")


def as_post(form: dict[str, Any], **changes: Any) -> dict[str, list[str]]:
    data: dict[str, list[str]] = {}
    for name, value in form["fields"]:
        if name != "csrfmiddlewaretoken":
            data.setdefault(name, []).append(value)
    for name, value in changes.items():
        data[name] = value if isinstance(value, list) else [value]
    return data


def log_entries(pk: int | None = None) -> Any:
    content_type = ContentType.objects.get_for_model(InboxMessage)
    entries = LogEntry.objects.filter(content_type=content_type)
    return entries if pk is None else entries.filter(object_id=str(pk))


def assert_audited(row: InboxMessage, user: Any, action: str, previous: str, reason: str) -> None:
    """One LogEntry for the row naming the user, the verb, the previous status, the reason;
    one history entry of the action's kind, by the user, via the admin, with the reason."""
    entries = list(log_entries(row.pk))
    assert len(entries) == 1, entries
    entry = entries[0]
    assert entry.user_id == user.pk
    assert entry.action_flag == CHANGE
    assert entry.change_message == f"{ACTIONS[action]['verb']} (was {previous}). Reason: {reason}"
    assert entry.object_repr == f"{row.consumer}:{row.message_id}"
    kind = KINDS[action]
    done = [e for e in row.history if e["kind"] == kind]
    assert len(done) == 1, row.history
    assert done[0]["by"] == f"{user.get_username()} (admin user {user.pk})"
    assert done[0]["via"] == "admin"
    assert done[0]["reason"] == reason
    assert done[0]["from"] == previous


def assert_changed_by(action: str, row: InboxMessage, before: tuple[Any, ...]) -> None:
    """The row went where ``action`` sends it."""
    now = timezone.now()
    if action in ("replay_messages", "force_rerun_messages"):
        assert (row.status, row.attempts, row.processed_at) == (Status.RECEIVED, 0, None)
        assert row.next_attempt_at is not None and row.next_attempt_at <= now
    elif action == "park_messages":
        assert (row.status, row.next_attempt_at) == (Status.PARKED, None)
    elif action == "skip_versions":
        assert (row.status, row.next_attempt_at) == (Status.SKIPPED, None)
    else:  # retry now: still failed, attempts kept, due now instead of in an hour
        assert (row.status, row.attempts) == (Status.FAILED, before[1])
        assert row.next_attempt_at is not None and row.next_attempt_at <= now < before[2]


# --- 1. permissions ------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("role", list(ROLES))
def test_changelist_shows_only_the_actions_the_user_may_run(role: str) -> None:
    make_row(Status.DEAD)
    client = login(make_user(role))

    response = client.get(CHANGELIST)

    if role == "staff":
        assert response.status_code == 403
        return
    assert response.status_code == 200
    choices = action_choices(html(response))
    if ALLOWED[role]:
        assert choices == ALLOWED[role], choices
        assert 'name="_selected_action"' in html(response)
    else:  # no action at all: no dropdown and no checkboxes
        assert choices is None
        assert 'name="_selected_action"' not in html(response)
    assert "delete_selected" not in html(response)


@pytest.mark.django_db
@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("role", list(ROLES))
def test_action_through_the_confirmation_page_only_when_permitted(role: str, action: str) -> None:
    """Post the action as the changelist does, then the confirmation page's own form. Users
    without the permission get no confirmation page, and their forged confirm changes nothing."""
    row = make_row(STARTS[action], **FIELDS.get(action, {}))
    untouched = make_row(STARTS[action], **FIELDS.get(action, {}))  # not selected
    user = make_user(role)
    client = login(user)
    before = snapshot()
    reason = f"ticket OPS-{row.pk}: {action}"

    first = client.post(CHANGELIST, {"action": action, "_selected_action": [row.pk], "index": 0})

    assert snapshot() == before, "the confirmation page changes nothing"
    if action in ALLOWED[role]:
        assert first.status_code == 200 and is_confirmation(first)
        page = html(first)
        assert ACTIONS[action]["title"] in page
        assert re.search(r'id="inbox-eligible"><strong>1</strong> selected message can', page)
        form = form_with(page, "confirm", "yes")
        assert as_post(form)["_selected_action"] == [str(row.pk)]
        data = as_post(form, reason=reason)
    else:
        assert not is_confirmation(first)
        assert first.status_code in ((403,) if role == "staff" else (200, 302))
        # Forge what the confirmation page would have posted.
        data = {
            "action": [action],
            "_selected_action": [str(row.pk)],
            "index": ["0"],
            "select_across": ["0"],
            "confirm": ["yes"],
            "reason": [reason],
        }

    second = client.post(CHANGELIST, data)

    after = snapshot()
    assert after[untouched.pk] == before[untouched.pk]
    if action not in ALLOWED[role]:
        assert not is_confirmation(second)
        assert second.status_code in ((403,) if role == "staff" else (200, 302))
        assert after == before
        assert not log_entries().exists()
        return
    assert second.status_code == 302, second.status_code
    row.refresh_from_db()
    assert_changed_by(action, row, before[row.pk])
    assert_audited(row, user, action, STARTS[action], reason)
    assert log_entries().count() == 1
    followed = client.get(second["Location"])
    assert f"{ACTIONS[action]['verb']} 1 message(s) (1 {STARTS[action]})." in html(followed)


@pytest.mark.django_db
@pytest.mark.parametrize("role", list(ROLES))
def test_forged_confirm_for_actions_the_user_lacks_changes_nothing(role: str) -> None:
    """confirm=yes posted directly for every action the role lacks, one row per action."""
    rows = {action: make_row(status, **FIELDS.get(action, {})) for action, status in STARTS.items()}
    client = login(make_user(role))
    before = snapshot()
    lacking = [action for action in ACTIONS if action not in ALLOWED[role]]

    for action in lacking:
        response = client.post(
            CHANGELIST,
            {
                "action": action,
                "_selected_action": [rows[action].pk],
                "index": 0,
                "confirm": "yes",
                "reason": "forged",
            },
        )
        assert not is_confirmation(response)
        assert response.status_code in ((403,) if role == "staff" else (200, 302))

    after = snapshot()
    for action in lacking:
        assert after[rows[action].pk] == before[rows[action].pk], action
    assert not log_entries().exists()
    if role == "superuser":
        assert lacking == []


@pytest.mark.django_db
@pytest.mark.parametrize("role", list(ROLES))
def test_post_without_csrf_token_is_rejected(role: str) -> None:
    rows = {action: make_row(status, **FIELDS.get(action, {})) for action, status in STARTS.items()}
    user = make_user(role)
    client = login(user, enforce_csrf_checks=True)
    before = snapshot()

    for action, row in rows.items():
        response = client.post(
            CHANGELIST,
            {
                "action": action,
                "_selected_action": [row.pk],
                "index": 0,
                "confirm": "yes",
                "reason": "no token",
            },
        )
        assert response.status_code == 403
        assert b"CSRF verification failed" in response.content

    assert snapshot() == before
    assert not log_entries().exists()

    if role == "superuser":  # control: the same request with the page's token goes through
        page = client.get(CHANGELIST)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html(page))
        assert token
        row = rows["park_messages"]
        response = client.post(
            CHANGELIST,
            {
                "action": "park_messages",
                "_selected_action": [row.pk],
                "index": 0,
                "confirm": "yes",
                "reason": "with token",
                "csrfmiddlewaretoken": token.group(1),
            },
        )
        assert response.status_code == 302
        row.refresh_from_db()
        assert row.status == Status.PARKED
        assert_audited(row, user, "park_messages", Status.RECEIVED, "with token")


@pytest.mark.django_db
@pytest.mark.parametrize("role", list(ROLES))
def test_detail_page_buttons_only_for_permitted_actions(role: str) -> None:
    """Buttons for the actions the user may run that apply to the message's status."""
    from django_inbox.admin.options import ACTIONS

    user = make_user(role)
    client = login(user)
    for status in (Status.DEAD, Status.FAILED, Status.COMPLETED):
        row = make_row(status)
        response = client.get(change_url(row.pk))
        if role == "staff":
            assert response.status_code == 403
            return
        assert response.status_code == 200
        page = html(response)
        # Skipping applies to a key's version in an ordered consumer only (below).
        expected = {
            name
            for name in ALLOWED[role]
            if status in ACTIONS[name]["from"] and name != "skip_versions"
        }
        assert set(re.findall(r'id="inbox-action-(\w+)"', page)) == expected, status
    version = make_row(Status.DEAD, consumer="ordered", key="case-1", sequence=2)
    offered = set(re.findall(r'id="inbox-action-(\w+)"', html(client.get(change_url(version.pk)))))
    assert ("skip_versions" in offered) == ("skip_versions" in ALLOWED[role])
    row = make_row(Status.DEAD)
    page = html(client.get(change_url(row.pk)))
    # Read-only: no save buttons, no delete link.
    for name in ("_save", "_continue", "_addanother", "_saveasnew"):
        assert f'name="{name}"' not in page
    assert reverse("admin:django_inbox_inboxmessage_delete", args=[row.pk]) not in page


@pytest.mark.django_db
def test_detail_page_button_opens_the_confirmation_then_replays() -> None:
    row = make_row(Status.DEAD)
    user = make_user("operator")
    client = login(user)
    page = html(client.get(change_url(row.pk)))
    form = form_with(page, "action", "replay_messages")
    assert form["attrs"]["action"] == CHANGELIST

    confirmation = client.post(form["attrs"]["action"], as_post(form))

    assert is_confirmation(confirmation)
    confirm = form_with(html(confirmation), "confirm", "yes")
    done = client.post(CHANGELIST, as_post(confirm, reason="consumer fixed"))
    assert done.status_code == 302
    row.refresh_from_db()
    assert row.status == Status.RECEIVED
    assert_audited(row, user, "replay_messages", Status.DEAD, "consumer fixed")


@pytest.mark.django_db
def test_force_rerun_needs_a_reason() -> None:
    row = make_row(Status.COMPLETED)
    user = make_user("superuser")
    client = login(user)
    first = client.post(
        CHANGELIST, {"action": "force_rerun_messages", "_selected_action": [row.pk], "index": 0}
    )
    assert is_confirmation(first)
    assert re.search(r'<textarea id="inbox-reason" name="reason"[^>]* required>', html(first))
    form = form_with(html(first), "confirm", "yes")
    before = snapshot()

    for empty in ("", "   \n "):
        response = client.post(CHANGELIST, as_post(form, reason=empty))
        assert response.status_code == 200 and is_confirmation(response)
        assert "a reason is required" in html(response)
        assert snapshot() == before
        assert not log_entries().exists()

    response = client.post(CHANGELIST, as_post(form, reason="ledger was wrong"))
    assert response.status_code == 302
    row.refresh_from_db()
    assert (row.status, row.attempts, row.processed_at) == (Status.RECEIVED, 0, None)
    assert_audited(row, user, "force_rerun_messages", Status.COMPLETED, "ledger was wrong")


@pytest.mark.django_db
def test_force_rerun_says_per_consumer_whether_side_effects_run() -> None:
    suppressing = make_row(Status.COMPLETED, consumer="notify", event_type="effect.notify")
    running = make_row(Status.COMPLETED, consumer="effects", event_type="effect.notify")
    client = login(make_user("superuser"))
    page = client.post(
        CHANGELIST,
        {
            "action": "force_rerun_messages",
            "_selected_action": [suppressing.pk, running.pk],
            "index": 0,
        },
    )
    assert is_confirmation(page)
    text = re.sub(r"<[^>]+>", "", html(page))
    assert "notify: side effects will be suppressed" in text
    assert "effects: side effects will run again" in text
    form = form_with(html(page), "confirm", "yes")
    assert client.post(CHANGELIST, as_post(form, reason="rebuild")).status_code == 302
    assert set(InboxMessage.objects.values_list("rerun", flat=True)) == {True}


@pytest.mark.django_db
def test_force_rerun_changes_only_completed_rows() -> None:
    completed = make_row(Status.COMPLETED)
    dead = make_row(Status.DEAD)
    received = make_row(Status.RECEIVED)
    user = make_user("superuser")
    client = login(user)
    selected = [completed.pk, dead.pk, received.pk]
    first = client.post(
        CHANGELIST, {"action": "force_rerun_messages", "_selected_action": selected, "index": 0}
    )
    page = html(first)
    assert re.search(r'id="inbox-eligible"><strong>1</strong> selected message can', page)
    assert "2 will be left unchanged" in page
    before = snapshot()

    done = client.post(
        CHANGELIST, as_post(form_with(page, "confirm", "yes"), reason="repair the ledger")
    )

    assert done.status_code == 302
    after = snapshot()
    assert after[dead.pk] == before[dead.pk] and after[received.pk] == before[received.pk]
    completed.refresh_from_db()
    assert completed.status == Status.RECEIVED
    assert_audited(completed, user, "force_rerun_messages", Status.COMPLETED, "repair the ledger")
    assert log_entries().count() == 1
    followed = html(client.get(done["Location"]))
    assert "Re-ran 1 message(s) (1 completed)." in followed
    # The rows left alone are the dead and the received one (not the one just re-run).
    assert "Left unchanged: 1 dead (not completed); 1 received (not completed)." in followed

    # Only non-completed rows selected: nothing can be changed, the button is disabled.
    page = html(
        client.post(
            CHANGELIST,
            {"action": "force_rerun_messages", "_selected_action": [dead.pk], "index": 0},
        )
    )
    assert re.search(r'id="inbox-eligible"><strong>0</strong> selected messages can', page)
    assert re.search(r'id="inbox-confirm"\s+disabled', page)
    before = snapshot()
    done = client.post(CHANGELIST, as_post(form_with(page, "confirm", "yes"), reason="no"))
    assert snapshot() == before
    assert "Re-ran no message." in html(client.get(done["Location"]))


@pytest.mark.django_db
@override_settings(INBOX_ALLOW_REPLAY_COMPLETED=False)
def test_force_rerun_respects_allow_replay_completed() -> None:
    row = make_row(Status.COMPLETED)
    client = login(make_user("superuser"))
    before = snapshot()

    done = client.post(
        CHANGELIST,
        {
            "action": "force_rerun_messages",
            "_selected_action": [row.pk],
            "index": 0,
            "confirm": "yes",
            "reason": "policy says no",
        },
    )

    assert snapshot() == before
    assert not log_entries().exists()
    followed = html(client.get(done["Location"]))
    assert "allow_replay_completed=False" in followed


@pytest.mark.django_db
def test_no_add_change_or_delete() -> None:
    row = make_row(Status.DEAD)
    client = login(make_user("superuser"))
    before = snapshot()

    assert client.get(reverse("admin:django_inbox_inboxmessage_add")).status_code == 403
    add = client.post(
        reverse("admin:django_inbox_inboxmessage_add"),
        {"consumer": "effects", "message_id": "new", "event_type": "x", "payload": "{}"},
    )
    assert add.status_code == 403
    delete_url = reverse("admin:django_inbox_inboxmessage_delete", args=[row.pk])
    assert client.get(delete_url).status_code == 403
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    change = client.post(
        change_url(row.pk),
        {"status": "completed", "message_id": "edited", "payload": "{}", "_save": "Save"},
    )
    assert change.status_code == 403
    # The bulk delete action is not offered, and forging it does nothing.
    assert "delete_selected" not in (action_choices(html(client.get(CHANGELIST))) or set())
    client.post(
        CHANGELIST,
        {"action": "delete_selected", "_selected_action": [row.pk], "index": 0, "post": "yes"},
    )

    assert list(InboxMessage.objects.values_list("pk", "message_id")) == [(row.pk, row.message_id)]
    assert snapshot() == before
    page = html(client.get(change_url(row.pk)))
    assert 'name="_save"' not in page and 'type="submit" value="Save"' not in page
    assert not log_entries().exists()


# --- 2. bulk -------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_select_across_replays_10000_dead_rows_in_one_request_then_each_runs_once() -> None:
    now = timezone.now()
    InboxMessage.objects.bulk_create(
        [
            InboxMessage(
                consumer="effects",
                message_id=f"bulk-{i}",
                event_type="effect.write",
                payload={},
                status=Status.DEAD,
                attempts=3,
                last_error="RuntimeError: down",
                received_at=now,
                updated_at=now,
            )
            for i in range(10_000)
        ],
        batch_size=5000,
    )
    # Parked rows are replayable too: the status filter must keep them out.
    parked = [make_row(Status.PARKED, f"parked-{i}") for i in range(5)]
    dead_pks = set(InboxMessage.objects.filter(status=Status.DEAD).values_list("pk", flat=True))
    assert len(dead_pks) == 10_000
    user = make_user("superuser")
    client = login(user)

    started = time.perf_counter()
    response = client.post(
        f"{CHANGELIST}?status__exact=dead",
        {
            "action": "replay_messages",
            "select_across": "1",
            "index": "0",
            "_selected_action": [min(dead_pks)],
            "confirm": "yes",
            "reason": "downstream is back",
        },
    )
    took = time.perf_counter() - started

    print(f"\nadmin select-across replay of 10,000 dead rows, one request: {took:.2f}s")
    assert response.status_code == 302, response.status_code
    assert response["Location"] == f"{CHANGELIST}?status__exact=dead"
    assert set(InboxMessage.objects.filter(pk__in=dead_pks).values_list("status", flat=True)) == {
        Status.RECEIVED
    }
    assert all(InboxMessage.objects.get(pk=row.pk).status == Status.PARKED for row in parked), (
        "a row outside the filter was replayed"
    )
    replays = [
        [entry for entry in entries if entry["kind"] == "replay"]
        for entries in InboxMessage.objects.filter(pk__in=dead_pks).values_list(
            "history", flat=True
        )
    ]
    assert len(replays) == 10_000
    assert all(len(found) == 1 for found in replays)
    assert {
        (e[0]["by"], e[0]["via"], e[0]["reason"], e[0]["from"], int(e[0]["attempts"]))
        for e in replays
    } == {(f"superuser (admin user {user.pk})", "admin", "downstream is back", "dead", 3)}
    logged = list(log_entries().values_list("object_id", "user_id", "action_flag"))
    assert len(logged) == 10_000
    assert {int(object_id) for object_id, _, _ in logged} == dead_pks
    assert {(user_id, flag) for _, user_id, flag in logged} == {(user.pk, CHANGE)}
    assert "Replayed 10,000 message(s) (10,000 dead)." in html(client.get(response["Location"]))

    started = time.perf_counter()
    stats = process_due(["effects"], max_messages=None)
    print(f"processed the 10,000 replayed rows in-process: {time.perf_counter() - started:.2f}s")

    assert stats.handled == 10_000
    assert lost_and_doubled({f"bulk-{i}" for i in range(10_000)}) == (0, 0)
    assert Effect.objects.filter(consumer="effects").count() == 10_000
    assert set(InboxMessage.objects.filter(pk__in=dead_pks).values_list("status", flat=True)) == {
        Status.COMPLETED
    }
    assert InboxMessage.objects.filter(status=Status.PARKED).count() == 5


# --- 3. escaping ---------------------------------------------------------------------------


@pytest.mark.django_db
def test_everything_from_a_message_is_escaped() -> None:
    evil = f"{XSS_SCRIPT}{XSS_IMG}"
    errors = [
        history.error_entry(
            None,
            attempt=attempt,
            at=timezone.now(),
            outcome=Status.DEAD if attempt == 3 else Status.FAILED,
            error_type=f"Boom{XSS_SCRIPT}",
            message=f"failed: {evil}",
        )
        for attempt in (1, 2, 3)
    ]
    for entry in errors:
        entry["traceback"] = f'Traceback (most recent call last):\n  File "{evil}"\nError: {evil}'
    row = make_row(
        Status.DEAD,
        f"id-{evil}",
        payload={"html": evil, evil: [evil, {"nested": evil}]},
        headers={"x-evil": evil},
        last_error=f"RuntimeError: {evil}",
        history=errors,
        source=f"src-{evil}",
        key=f"key-{evil}",
    )
    # A second consumer and event type whose names are hostile (summary, banner, filters).
    make_row(Status.DEAD, "plain", consumer=f"c-{XSS_SCRIPT}", event_type=f"e-{XSS_IMG}")
    user = make_user("superuser", username=f"admin{XSS_IMG}")
    client = login(user)

    def check(page: str, where: str) -> None:
        assert "<script>alert(1)" not in page, where
        assert "<img src=x" not in page, where
        assert "&lt;script&gt;" in page, where

    changelist = html(client.get(CHANGELIST))
    check(changelist, "changelist")
    assert 'id="inbox-problems"' in changelist
    check(html(client.get(f"{CHANGELIST}?q=id-{evil}")), "search")

    detail = html(client.get(change_url(row.pk)))
    check(detail, "detail")
    assert "&lt;img src=x onerror=alert(1)&gt;" in detail

    confirmation = client.post(
        CHANGELIST,
        {
            "action": "park_messages",
            "_selected_action": [row.pk],
            "index": 0,
            "reason": f"reason {evil}",
            "select_across": XSS_SCRIPT,  # echoed back into the form
        },
    )
    assert is_confirmation(confirmation)
    check(html(confirmation), "confirmation")

    # Park it with a hostile reason: the timeline, the history page and the log show it escaped.
    done = client.post(
        CHANGELIST,
        {
            "action": "park_messages",
            "_selected_action": [row.pk],
            "index": 0,
            "confirm": "yes",
            "reason": f"reason {evil}",
        },
    )
    assert done.status_code == 302
    row.refresh_from_db()
    assert row.status == Status.PARKED
    check(html(client.get(done["Location"])), "changelist after action")
    detail = html(client.get(change_url(row.pk)))
    check(detail, "detail after action")
    assert "reason &lt;script&gt;alert(1)&lt;/script&gt;" in detail
    history_url = reverse("admin:django_inbox_inboxmessage_history", args=[row.pk])
    check(html(client.get(history_url)), "object history")
    check(html(client.get(reverse("admin:index"))), "admin index (recent actions)")


# --- 4. payload hiding ---------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "operator", "payload_viewer", "superuser"])
def test_payload_only_with_its_permission(role: str) -> None:
    row = make_row(
        Status.DEAD,
        payload={"card": "4111-SECRET-CARD", "amount": 12},
        headers={"authorization": "Bearer SECRET-TOKEN"},
    )
    if role == "payload_viewer":
        user = make_user("viewer", username="payload_viewer")
        user.user_permissions.add(
            Permission.objects.get(
                content_type__app_label="django_inbox", codename="view_payload_inboxmessage"
            )
        )
    else:
        user = make_user(role)
    client = login(user)

    page = html(client.get(change_url(row.pk)))
    changelist = html(client.get(CHANGELIST))

    assert "SECRET" not in changelist
    # Lookups in the changelist's URL would tell whether a payload matches: refused (400)
    # for users who may not see payloads, allowed for those who may.
    probes = {
        "payload__card": "4111-SECRET-CARD",
        "payload__card__startswith": "4111",
        "headers__authorization__icontains": "secret-token",
        "payload__has_key": "card",
    }
    for lookup, value in probes.items():
        response = client.get(CHANGELIST, {lookup: value})
        if role in ("viewer", "operator"):
            assert response.status_code == 400, lookup
        else:
            assert result_pks(response) == {row.pk}, lookup
    if role in ("viewer", "operator"):
        assert "Hidden: payloads may hold personal data" in page
        assert "SECRET" not in page and "4111" not in page
        assert 'class="inbox-json"' not in page
    else:
        assert "Hidden: payloads" not in page
        pretty = "{\n  &quot;amount&quot;: 12,\n  &quot;card&quot;: &quot;4111-SECRET-CARD&quot;\n}"
        assert f'<pre class="inbox-json">{pretty}</pre>' in page
        assert "&quot;authorization&quot;: &quot;Bearer SECRET-TOKEN&quot;" in page


# --- 5. search, filters, summary, pagination -----------------------------------------------


@pytest.mark.django_db
def test_search() -> None:
    a = make_row(Status.DEAD, "order-1", key="k-1", source="shop")
    b = make_row(Status.COMPLETED, "order-1", consumer="stream", key="k-9", source="shop")
    c = make_row(Status.RECEIVED, "order-2", consumer="adhoc", key="k-2", source="billing")
    client = login(make_user("viewer"))

    def search(term: str) -> set[int]:
        return result_pks(client.get(CHANGELIST, {"q": term}))

    assert search("order-1") == {a.pk, b.pk}, "exact id, in every consumer"
    assert search("  order-1 ") == {a.pk, b.pk}
    assert search("order-2") == {c.pk}, "a consumer with rows but no handler or policy"
    assert search("order") == set(), "exact, not a substring"
    assert search("key:k-2") == {c.pk}
    assert search("key: k-1") == {a.pk}
    assert search("source:shop") == {a.pk, b.pk}
    assert search("source:nowhere") == set()
    assert search(f"pk:{b.pk}") == {b.pk}
    assert search("pk:abc") == set()
    assert search("pk:²") == set(), "a digit int() refuses: no match, not a 500"
    assert search("pk:99999999999999999999") == set(), "beyond bigint: no match, not a 500"
    assert search("nothing-like-this") == set()
    assert search("") == {a.pk, b.pk, c.pk}
    page = html(client.get(CHANGELIST, {"q": "nothing-like-this"}))
    assert paginator_line(page).startswith("0 inbox messages")


@pytest.mark.django_db
def test_filters() -> None:
    dead = make_row(Status.DEAD, event_type="effect.write")
    failed = make_row(Status.FAILED, consumer="stream", event_type="stream.tick")
    parked = make_row(Status.PARKED, consumer="audit", event_type="odd.type")
    old = make_row(Status.COMPLETED, received_at=timezone.now() - timedelta(days=10))
    day_old = make_row(Status.COMPLETED, received_at=timezone.now() - timedelta(hours=5))
    client = login(make_user("viewer"))

    def listed(**params: str) -> set[int]:
        return result_pks(client.get(CHANGELIST, params))

    assert listed(status__exact="dead") == {dead.pk}
    assert listed(status__exact="completed") == {old.pk, day_old.pk}
    assert listed(consumer="stream") == {failed.pk}
    assert listed(consumer="effects") == {dead.pk, old.pk, day_old.pk}
    assert listed(event_type="odd.type") == {parked.pk}
    assert listed(consumer="effects", status__exact="completed") == {old.pk, day_old.pk}
    assert listed(received="1h") == {dead.pk, failed.pk, parked.pk}
    assert listed(received="24h") == {dead.pk, failed.pk, parked.pk, day_old.pk}
    assert listed(received="7d") == {dead.pk, failed.pk, parked.pk, day_old.pk}
    assert listed(received="older") == {old.pk}
    assert listed(consumer="nobody") == set()
    page = html(client.get(CHANGELIST))
    # The filters offer the consumers and event types that exist (parked rows' types too).
    for choice in ("?consumer=stream", "?consumer=audit", "?event_type=odd.type", "?received=1h"):
        assert choice in page, choice


@pytest.mark.django_db
def test_list_is_not_sortable_by_url() -> None:
    """sortable_by = (): ?o=N (a column index) must not sort the table by that column."""
    rows = [make_row(Status.DEAD, f"{name}-id", consumer=name) for name in ("zeta", "alpha", "mid")]
    client = login(make_user("viewer"))
    newest_first = [row.pk for row in reversed(rows)]

    for order in ("1", "-1", "2", "-2", "6", "1.2"):
        response = client.get(CHANGELIST, {"o": order})
        assert [row.pk for row in response.context["cl"].result_list] == newest_first, order
    assert 'class="sortable' not in html(response)


@pytest.mark.django_db
def test_summary_banner_and_pagination_count() -> None:
    client = login(make_user("viewer"))
    make_row(Status.COMPLETED)
    make_row(Status.COMPLETED)
    received = make_row(Status.RECEIVED, consumer="stream")

    page = html(client.get(CHANGELIST))

    assert 'id="inbox-healthy"' in page and 'id="inbox-problems"' not in page
    assert paginator_line(page) == "3 inbox messages"
    summary = client.get(CHANGELIST).context["inbox_summary"]
    rows = {
        row["consumer"]: {c["status"]: c["count"] for c in row["cells"]} for row in summary["rows"]
    }
    # Consumers with nothing to process or fix are folded into one line under the table.
    assert "effects" not in rows and rows["stream"]["received"] == 1
    assert "effects" in [row["consumer"] for row in summary["quiet"]]
    assert re.search(r'id="inbox-quiet">.*<a href="[^"]*\?consumer=effects">effects</a>', page)
    assert '?consumer=stream&amp;status__exact=received">1</a>' in page

    make_row(Status.DEAD)
    page = html(client.get(CHANGELIST))
    summary = client.get(CHANGELIST).context["inbox_summary"]
    rows = {
        row["consumer"]: {c["status"]: c["count"] for c in row["cells"]} for row in summary["rows"]
    }
    assert rows["effects"]["completed"] == 2 and rows["effects"]["dead"] == 1
    assert '?consumer=effects&amp;status__exact=completed">2</a>' in page
    assert 'id="inbox-problems"' in page and 'id="inbox-healthy"' not in page
    assert "effects: 1 dead message(s) need an operator" in page
    assert '?consumer=effects&amp;status__exact=dead">show them</a>' in page
    assert paginator_line(page) == "4 inbox messages"
    assert paginator_line(html(client.get(CHANGELIST, {"status__exact": "dead"}))) == (
        "1 inbox message"
    )
    # A consumer name that needs URL-encoding still links to its own rows.
    odd = make_row(Status.DEAD, consumer="a&b c")
    page = html(client.get(CHANGELIST))
    links = re.findall(r'href="[^"?]*(\?consumer=a[^"]*status__exact=dead)">1</a>', page)
    assert links, "no summary link for the odd consumer"
    target = links[0].replace("&amp;", "&")
    assert result_pks(client.get(CHANGELIST + target)) == {odd.pk}
    assert received.pk not in result_pks(client.get(CHANGELIST + target))


@pytest.mark.postgres
@pytest.mark.django_db
def test_pagination_says_more_than_the_cap_when_the_count_is_capped() -> None:
    from django_inbox.admin.paginator import COUNT_CAP

    def analyze() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {InboxMessage._meta.db_table}")

    analyze()  # the table's estimate is now "empty", whatever earlier tests left
    now = timezone.now()
    InboxMessage.objects.bulk_create(
        [
            InboxMessage(
                consumer="effects",
                message_id=f"cap-{i}",
                event_type="effect.write",
                payload={},
                status=Status.COMPLETED,
                received_at=now,
                updated_at=now,
                processed_at=now,
            )
            for i in range(COUNT_CAP + 1)
        ],
        batch_size=5000,
    )
    client = login(make_user("viewer"))

    def line(**params: str) -> str:
        return paginator_line(html(client.get(CHANGELIST, params)))

    # The estimate is stale (0), so the list is counted, and the count stops at the cap.
    assert line().endswith(" more than 10,000 inbox messages"), line()
    assert line(status__exact="completed").endswith(" more than 10,000 inbox messages")
    assert line(status__exact="dead") == "0 inbox messages"
    analyze()  # now the unfiltered list shows PostgreSQL's estimate
    assert line().endswith(" ~10,001 inbox messages"), line()
    assert line(status__exact="completed").endswith(" more than 10,000 inbox messages")
    assert line(q=f"pk:{InboxMessage.objects.order_by('pk')[0].pk}") == "1 inbox message"


# --- 6. INBOX_ADMIN and replacing the admin ------------------------------------------------


@pytest.fixture
def fresh_site(monkeypatch: pytest.MonkeyPatch) -> admin.AdminSite:
    """A new, empty default admin site for the duration of a test (the real one is restored)."""
    site = admin.AdminSite(name="admin")
    monkeypatch.setattr(admin, "site", site)
    return site


def test_inbox_admin_false_leaves_the_model_unregistered(fresh_site: admin.AdminSite) -> None:
    import django_inbox.admin as inbox_admin

    with override_settings(INBOX_ADMIN=False):
        importlib.reload(inbox_admin)
    assert not fresh_site.is_registered(InboxMessage)

    with override_settings(INBOX_ADMIN=True):
        importlib.reload(inbox_admin)
        importlib.reload(inbox_admin)  # importing twice does not register twice
    assert fresh_site.is_registered(InboxMessage)
    assert type(fresh_site._registry[InboxMessage]) is InboxMessageAdmin
    # The real site is untouched by all this.
    assert admin.sites.site.is_registered(InboxMessage)


@pytest.mark.django_db
def test_a_project_can_replace_the_admin_with_a_subclass(fresh_site: admin.AdminSite) -> None:
    import django_inbox.admin as inbox_admin

    importlib.reload(inbox_admin)
    assert fresh_site.is_registered(InboxMessage)

    class ProjectInboxAdmin(inbox_admin.InboxMessageAdmin):
        list_per_page = 2

    fresh_site.unregister(InboxMessage)
    fresh_site.register(InboxMessage, ProjectInboxAdmin)
    urls = types.ModuleType("inbox_admin_test_urls")
    urls.urlpatterns = [path("admin/", fresh_site.urls)]  # type: ignore[attr-defined]
    rows = [make_row(Status.DEAD) for _ in range(3)]
    client = login(make_user("operator"))

    with override_settings(ROOT_URLCONF=urls):
        response = client.get(CHANGELIST)
        assert response.status_code == 200
        assert isinstance(response.context["cl"].model_admin, ProjectInboxAdmin)
        assert result_pks(response) == {rows[2].pk, rows[1].pk}, "two per page, newest first"
        assert action_choices(html(response)) == ALLOWED["operator"]
        done = client.post(
            CHANGELIST,
            {
                "action": "park_messages",
                "_selected_action": [rows[0].pk],
                "index": 0,
                "confirm": "yes",
                "reason": "subclass",
            },
        )
        assert done.status_code == 302
    rows[0].refresh_from_db()
    assert rows[0].status == Status.PARKED


@pytest.mark.django_db
def test_the_banner_shows_an_ordered_key_held_up_by_a_parked_version() -> None:
    """Parked by its handler (not a problem alone), with a later version waiting behind it:
    the key does not move until an operator acts, and the banner says so with a link."""
    from django_inbox.models import InboxKey

    client = login(make_user("viewer"))
    InboxKey.objects.create(consumer="ordered", key="K", applied_sequence=1)
    make_row(Status.PARKED, "v2", consumer="ordered", key="K", sequence=2)
    assert 'id="inbox-healthy"' in html(client.get(CHANGELIST))
    make_row(Status.WAITING, "v3", consumer="ordered", key="K", sequence=3)

    page = html(client.get(CHANGELIST))

    assert 'id="inbox-problems"' in page
    assert "ordered: 1 key(s) held up by a version parked for a gap or by a dead or parked" in page
    assert '?consumer=ordered&amp;status__exact=parked">show parked versions</a>' in page
