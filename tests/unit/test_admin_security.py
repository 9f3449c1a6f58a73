"""The admin against what a handler's error may quote and what a URL may carry.

Error texts and tracebacks often quote the payload (``f"card declined: {payload}"``): only
users who may see payloads see or search them; the others see the exception's class and
when it happened. No query string, however hostile, is a server error.
"""

from __future__ import annotations

import itertools
import random
from io import StringIO
from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from django_inbox import history
from django_inbox.models import InboxMessage
from tests.databases import on_mariadb
from tests.unit.test_admin import CHANGELIST, change_url, html, login, make_row, make_user

Status = InboxMessage.Status
SECRET = "4111-SECRET-CARD"


def failed_row() -> InboxMessage:
    try:
        raise RuntimeError(f"card declined: {{'card': '{SECRET}'}}")
    except RuntimeError as exc:
        entry = history.error_entry(exc, attempt=1, at=timezone.now(), outcome=Status.DEAD)
    return make_row(
        Status.DEAD,
        payload={"card": SECRET},
        last_error=history.summary(entry),
        history=[entry],
    )


def user_with(role: str) -> Any:
    if role != "payload_viewer":
        return make_user(role)
    user = make_user("viewer", username="payload_viewer")
    user.user_permissions.add(
        Permission.objects.get(
            content_type__app_label="django_inbox", codename="view_payload_inboxmessage"
        )
    )
    return user


@pytest.mark.django_db
@pytest.mark.parametrize("role", ["viewer", "operator", "payload_viewer", "superuser"])
def test_error_texts_and_tracebacks_only_with_the_payload_permission(role: str) -> None:
    row = failed_row()
    client = login(user_with(role))

    changelist = html(client.get(CHANGELIST))
    detail = html(client.get(change_url(row.pk)))
    searches = {
        lookup: client.get(CHANGELIST, {lookup: "SECRET"})
        for lookup in ("last_error__icontains", "history__icontains", "last_error__contains")
    }

    may_see = role in ("payload_viewer", "superuser")
    for page in (changelist, detail):
        assert (SECRET in page) is may_see, role
        assert "RuntimeError" in page, "the exception's class is shown to every viewer"
    assert ("Traceback" in detail) is may_see
    for lookup, response in searches.items():
        if may_see:
            assert response.status_code == 200, lookup
            assert row.pk in {r.pk for r in response.context["cl"].result_list}, lookup
        else:
            assert response.status_code == 400, lookup
    if not may_see:
        assert "Hidden: error messages may quote the payload" in detail


HOSTILE_VALUES = [
    "\x00",
    "dead\x00",
    "\x00x",
    "%00",
    "\ud800",
    "x" * 5000,
    "9" * 40,
    "-1",
    "1e309",
    "nan",
    "2026-13-45",
    "' OR 1=1 --",
    "<script>",
    "[]",
    "{}",
    "",
]
HOSTILE_KEYS = [
    "status",
    "status__exact",
    "consumer",
    "event_type",
    "received",
    "q",
    "o",
    "p",
    "e",
    "all",
    "pk",
    "id__gt",
    "attempts",
    "attempts__gte",
    "received_at__gte",
    "next_attempt_at__lt",
    "message_id",
    "message_id__in",
    "key",
    "source__startswith",
    "_changelist_filters",
    "\x00",
]


@pytest.mark.django_db
def test_no_query_string_is_a_server_error() -> None:
    make_row(Status.DEAD)
    make_row(Status.COMPLETED)
    client = login(make_user("superuser"))
    rng = random.Random(7)
    pairs = list(itertools.product(HOSTILE_KEYS, HOSTILE_VALUES))
    combos = [[pair] for pair in pairs] + [rng.sample(pairs, 3) for _ in range(150)]

    errors = []
    for query in combos:
        # Lone surrogates reach the server as the invalid UTF-8 of their code points.
        encoded = "&".join(
            f"{quote(k, errors='surrogatepass')}={quote(v, errors='surrogatepass')}"
            for k, v in query
        )
        response = client.get(f"{CHANGELIST}?{encoded}")
        if response.status_code >= 500:
            errors.append((query, response.status_code))
    for value in ("\x00", "1\x00", "9" * 40):
        response = client.get(f"{CHANGELIST}{value}/change/")
        if response.status_code >= 500:
            errors.append((value, response.status_code))

    assert errors == []


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query", ["event_type=%00", "status=dead%00", "consumer=%00x", "q=%00", "status__exact=%00"]
)
def test_nul_in_a_filter_is_a_bad_request(query: str) -> None:
    make_row(Status.DEAD)
    client = login(make_user("superuser"))

    response = client.get(f"{CHANGELIST}?{query}")

    assert response.status_code == 400


def store_deep(row: InboxMessage, depth: int, column: str = "payload") -> None:
    """Give ``row`` a stored value ``depth`` arrays deep, as an earlier release or a hand-made
    row may hold (the inbox refuses such values now)."""
    table = InboxMessage._meta.db_table
    value = "[" * depth + "1" + "]" * depth
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET {column} = %s WHERE id = %s", [value, row.pk])


@pytest.mark.django_db
@pytest.mark.parametrize(
    "depth",
    # SQLite's json_valid() refuses nesting past 1,000: only PostgreSQL stores the deeper ones.
    [
        900,
        950,
        pytest.param(3000, marks=pytest.mark.postgres),
        pytest.param(5000, marks=pytest.mark.postgres),
    ],
)
@pytest.mark.parametrize("column", ["payload", "headers"])
def test_a_stored_value_too_deep_for_python_shows_as_text(depth: int, column: str) -> None:
    row = make_row(Status.DEAD)
    if on_mariadb():
        # MariaDB's JSON columns refuse values nested 32 levels or more: no row holds one.
        with (
            pytest.raises(DatabaseError, match=r"CONSTRAINT|json_valid|4025"),
            transaction.atomic(),
        ):
            store_deep(row, depth, column)
        return
    store_deep(row, depth, column)
    client = login(make_user("superuser"))

    response = client.get(change_url(row.pk))

    assert response.status_code == 200
    page = html(response)
    assert 'class="inbox-json"' in page, "the value is shown"
    if depth >= 3000:  # never decodable: shown as the stored text
        assert "Shown as stored: nested deeper than this Python process can decode" in page
        assert "[[[[[[[[" in page


@pytest.mark.django_db
@pytest.mark.parametrize("object_id", ["²", "١٢", "٣", "\uff11", "9" * 19, "9" * 4301, "-1", "1.0"])
def test_an_object_id_int_refuses_is_not_a_server_error(object_id: str) -> None:
    make_row(Status.DEAD)
    client = login(make_user("superuser"))
    response = client.get(f"{CHANGELIST}{object_id}/change/", follow=True)
    assert response.status_code == 200
    response = client.get(f"{CHANGELIST}?q=pk:{object_id}")
    assert response.status_code == 200


ODD_HISTORIES = [
    "null", "5", '"abc"', "[null]", '[{"kind": ["a"], "at": "2026-01-01T00:00:00"}]',
    '[{"kind": "error", "at": 5}]', '[{"kind": "error", "at": "x", "retry_at": {"a": 1}}]',
    '[{"kind": "replay", "at": "2026-13-45T99:00:00", "attempts": "three"}]',
    '[{"kind": "error", "at": null}, {"kind": "interrupted"}]',
]  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize("stored", ODD_HISTORIES)
def test_a_history_written_by_hand_shows_in_the_admin_and_inbox_show(stored: str) -> None:
    """Each answered 500 in the admin and a traceback from inbox_show."""
    row = make_row(Status.DEAD)
    table = InboxMessage._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET history = %s WHERE id = %s", [stored, row.pk])
    client = login(make_user("superuser"))

    assert client.get(change_url(row.pk)).status_code == 200
    assert client.get(CHANGELIST).status_code == 200
    out = StringIO()
    call_command("inbox_show", row.message_id, stdout=out)
    call_command("inbox_show", row.message_id, "--json", stdout=StringIO())
    assert row.message_id in out.getvalue()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    [
        "received_at__year=0", "updated_at__year=10000", "received_at__iso_year=99999",
        "message_id__regex=(((", "source__regex=*", "id__range=1", "key__iregex=[",
        "received_at__date=x", "attempts__lt__gt=1", "payload__a__regex=(((",
    ],
)  # fmt: skip
@pytest.mark.parametrize("role", ["viewer", "superuser"])
def test_lookups_that_transform_or_match_patterns_are_refused(query: str, role: str) -> None:
    """Each answered 500 (or read the table by a regular expression) for any user who may see
    the list."""
    make_row(Status.DEAD)
    client = login(make_user(role))
    assert client.get(f"{CHANGELIST}?{query}").status_code == 400


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    ["key=K-1", "status__exact=dead", "received_at__gte=2020-01-01T00:00:00%2B00:00",
     "attempts__gt=0", "source__startswith=orders", "consumer=effects", "received=today",
     "id__in=1,2"],
)  # fmt: skip
def test_plain_lookups_still_filter(query: str) -> None:
    make_row(Status.DEAD)
    client = login(make_user("viewer"))
    assert client.get(f"{CHANGELIST}?{query}").status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query", ["payload__date=2026-01-01", "payload__year__gt=1", "headers__len=3"]
)
def test_in_a_json_column_names_of_transforms_are_keys(query: str) -> None:
    make_row(Status.DEAD)
    client = login(make_user("superuser"))  # payload filters need the payload permission
    assert client.get(f"{CHANGELIST}?{query}").status_code == 200
