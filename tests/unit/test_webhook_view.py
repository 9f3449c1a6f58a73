"""``webhook_view``: statuses, what is stored, and what never is, through Django's test client
and the test project's routes (``testproject/urls.py``). The live server, an ASGI server and
concurrent senders are in tests/system."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client, override_settings
from effects.models import Effect
from standardwebhooks import Webhook
from testproject.urls import GITHUB_SECRET, STANDARD_SECRET, STRIPE_SECRET

from django_inbox.models import InboxMessage
from tests.effects import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


def post(path: str, body: bytes, headers: dict[str, str], client: Client | None = None) -> Any:
    return (client or Client()).generic(
        "POST", path, body, content_type="application/json", headers=headers
    )


def standard(body: bytes, message_id: str = "msg_1", at: float | None = None) -> dict[str, str]:
    stamp = int(time.time() if at is None else at)
    when = datetime.fromtimestamp(stamp, UTC)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": Webhook(STANDARD_SECRET).sign(message_id, when, body.decode()),
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    }


def event(**fields: Any) -> bytes:
    return json.dumps({"type": "effect.write", **fields}).encode()


def test_a_new_message_is_stored_and_its_resend_is_a_duplicate() -> None:
    body = event(order=1)
    first = post("/hooks/standard/", body, standard(body))
    again = post("/hooks/standard/", body, standard(body))

    assert (first.status_code, first.json()) == (202, {"stored": True, "duplicate": False})
    assert (again.status_code, again.json()) == (200, {"stored": False, "duplicate": True})
    row = InboxMessage.objects.get()
    assert (row.consumer, row.message_id, row.event_type) == ("effects", "msg_1", "effect.write")
    assert (row.status, row.source, row.payload) == (
        Status.RECEIVED,
        "webhook",
        {"type": "effect.write", "order": 1},
    )
    assert row.headers == {"traceparent": standard(body)["traceparent"]}


def test_deliver_mode_processes_inline_once() -> None:
    body = event()
    first = post("/hooks/standard/deliver/", body, standard(body, "msg_d"))
    again = post("/hooks/standard/deliver/", body, standard(body, "msg_d"))
    assert (first.status_code, first.json()) == (200, {"outcome": "processed"})
    assert (again.status_code, again.json()) == (200, {"outcome": "duplicate"})
    assert effect_counts() == {"msg_d": 1}


@pytest.mark.parametrize(
    ("headers", "body", "status", "says"),
    [
        (lambda b: {}, event(), 401, "required"),
        (lambda b: standard(b + b" "), event(), 401, "no v1 signature"),
        (lambda b: standard(b, at=time.time() - 3600), event(), 401, "more than 300s"),
        (lambda b: standard(b), b"not json", 400, "not JSON"),
        (lambda b: standard(b), b'{"id": "x"}', 400, "no event type"),
        (lambda b: standard(b), b"[1, 2]", 400, "no event type"),
    ],
    ids=["unsigned", "tampered", "replayed an hour later", "not json", "no type", "not an object"],
)
def test_refused_requests_store_nothing(headers, body, status, says) -> None:  # type: ignore[no-untyped-def]
    response = post("/hooks/standard/", body, headers(body))
    assert response.status_code == status
    assert says in response.json()["error"]
    assert not InboxMessage.objects.exists()


def test_a_body_that_is_not_utf8_is_400_and_the_payload_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = b'{"type": "effect.write", "secret": "\xff\xfe"}'
    headers = standard(b"x")
    headers["webhook-signature"] = (
        "v1,"
        + base64.b64encode(
            hmac.new(
                base64.b64decode(STANDARD_SECRET.removeprefix("whsec_")),
                f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body,
                hashlib.sha256,
            ).digest()
        ).decode()
    )
    with caplog.at_level("INFO", logger="django_inbox"):
        response = post("/hooks/standard/", body, headers)
    assert (response.status_code, response.json()) == (400, {"error": "the body is not UTF-8"})
    assert "secret" not in caplog.text and "refused (400)" in caplog.text
    assert not InboxMessage.objects.exists()


@override_settings(INBOX_MAX_PAYLOAD_BYTES=1000)
def test_a_body_past_the_limit_is_413_and_is_not_read_further() -> None:
    big = event(filler="x" * 2000)
    response = post("/hooks/standard/", big, standard(big))
    assert response.status_code == 413
    assert "larger than 1000 bytes" in response.json()["error"]
    assert not InboxMessage.objects.exists()


def test_other_methods_are_405() -> None:
    response = Client().get("/hooks/standard/")
    assert (response.status_code, response["Allow"]) == (405, "POST")


def test_github_deliveries_take_the_id_and_event_from_their_headers() -> None:
    body = b'{"zen": "Keep it logically awesome."}'
    digest = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Event": "ping",
    }
    assert post("/hooks/github/", body, headers).status_code == 202
    row = InboxMessage.objects.get()
    assert (row.message_id, row.event_type) == ("72d3162e-cc78-11e3-81ab-4c9367dc0958", "ping")
    wrong = {**headers, "X-Hub-Signature-256": "sha256=" + "0" * 64}
    assert post("/hooks/github/", body, wrong).status_code == 401


def test_stripe_events_take_the_id_and_type_from_the_body() -> None:
    body = json.dumps({"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "type": "effect.write"}).encode()
    stamp = str(int(time.time()))
    digest = hmac.new(STRIPE_SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256)
    headers = {"Stripe-Signature": f"t={stamp},v1={digest.hexdigest()}"}
    assert post("/hooks/stripe/", body, headers).status_code == 202
    assert post("/hooks/stripe/", body, headers).status_code == 200
    assert InboxMessage.objects.get().message_id == "evt_1NG8Du2eZvKYlo2CUI79vXWy"


@override_settings(CSRF_COOKIE_NAME="csrftoken")
def test_csrf_does_not_apply_to_a_sender() -> None:
    body = event()
    response = post("/hooks/standard/", body, standard(body), Client(enforce_csrf_checks=True))
    assert response.status_code == 202


def test_under_atomic_requests_the_inbox_commits_its_own_transaction() -> None:
    """The view is not wrapped in the request's transaction: the inbox opens and commits its
    own, as deliver() needs."""
    from django.db import connection

    connection.settings_dict["ATOMIC_REQUESTS"] = True
    try:
        body = event()
        assert post("/hooks/standard/deliver/", body, standard(body, "msg_a")).status_code == 200
    finally:
        connection.settings_dict["ATOMIC_REQUESTS"] = False
    assert Effect.objects.filter(message_id="msg_a").count() == 1
    assert InboxMessage.objects.get(message_id="msg_a").status == Status.COMPLETED
    # Exempt from the request's transaction: its 2xx comes after the inbox committed, not
    # before a request transaction that could still roll back.
    from django.urls import resolve

    assert connection.alias in resolve("/hooks/standard/deliver/").func._non_atomic_requests


def test_the_async_view_is_a_coroutine_function_with_the_same_exemptions() -> None:
    from asgiref.sync import iscoroutinefunction
    from django.urls import resolve

    for path, is_async in [("/hooks/standard/", False), ("/hooks/standard/async/", True)]:
        view = resolve(path).func
        assert iscoroutinefunction(view) is is_async
        assert view.csrf_exempt is True
        assert set(view._non_atomic_requests) == {"default"}  # every database configured


def test_the_async_views_answer_as_the_sync_ones() -> None:
    import asyncio

    from asgiref.sync import sync_to_async
    from django.db import connections

    try:
        asyncio.run(through_the_async_views())
    finally:
        # Django's thread for async database work opened its own connection: closed, as a
        # request's end would, so the test database can be dropped.
        asyncio.run(sync_to_async(connections.close_all, thread_sensitive=True)())


async def through_the_async_views() -> None:
    from asgiref.sync import sync_to_async
    from django.test import AsyncClient

    client = AsyncClient(enforce_csrf_checks=True)
    body = event(order=1)
    first = await client.post(
        "/hooks/standard/async/", body, content_type="application/json", headers=standard(body)
    )
    again = await client.post(
        "/hooks/standard/async/", body, content_type="application/json", headers=standard(body)
    )
    assert (first.status_code, first.json()) == (202, {"stored": True, "duplicate": False})
    assert (again.status_code, again.json()) == (200, {"stored": False, "duplicate": True})

    delivered = await client.post(
        "/hooks/standard/async/deliver/",
        body,
        content_type="application/json",
        headers=standard(body, "msg_ad"),
    )
    assert (delivered.status_code, delivered.json()) == (200, {"outcome": "processed"})
    tampered = await client.post(
        "/hooks/standard/async/",
        body + b" ",
        content_type="application/json",
        headers=standard(body, "msg_t"),
    )
    assert tampered.status_code == 401
    wrong_method = await client.get("/hooks/standard/async/")
    assert (wrong_method.status_code, wrong_method["Allow"]) == (405, "POST")

    ids = await sync_to_async(
        lambda: sorted(InboxMessage.objects.values_list("message_id", flat=True))
    )()
    assert ids == ["msg_1", "msg_ad"]
    assert await sync_to_async(effect_counts)() == {"msg_ad": 1}


def test_a_negative_content_length_is_400() -> None:
    body = event()
    response = Client().generic(
        "POST", "/hooks/standard/", body, content_type="application/json",
        headers=standard(body), CONTENT_LENGTH="-5",
    )  # fmt: skip
    assert (response.status_code, response.json()) == (400, {"error": "Content-Length is negative"})
    assert not InboxMessage.objects.exists()


def test_an_error_of_the_service_itself_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the service (not the sender's input, not the database) is a 500: the sender
    retries, and the error reaches the service's error reporting rather than a 2xx or 4xx."""
    from django_inbox.intake import storing

    def broken(**message: Any) -> bool:
        raise RuntimeError("a bug")

    monkeypatch.setattr(storing, "store", broken)
    body = event()
    with pytest.raises(RuntimeError, match="a bug"):
        post("/hooks/standard/", body, standard(body))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"id": "evt_\u0000nul"}, "message_id contains a NUL"),
        ({"id": "x" * 10_000}, "message_id is 10000 characters long"),
        ({"id": "evt_ok", "note": "a NUL \u0000 in a value"}, "payload contains a NUL"),
        ({"id": "evt_ok", "type": "t" * 10_000}, "event_type is 10000 characters long"),
        ({"id": "evt_ok", "deep": json.loads("[" * 200 + "]" * 200)}, "payload is nested more"),
        ({"id": True}, "no message id"),
        ({"id": 10**30}, None),  # an integer id is taken as its digits
    ],
    ids=["nul id", "long id", "nul in payload", "long type", "deep", "bool id", "huge int id"],
)
def test_hostile_fields_of_a_signed_body_are_400_never_500(
    fields: dict[str, Any], says: str | None
) -> None:
    """A sender (or whoever holds its secret) can sign anything: what the inbox cannot store
    is a 400 with the reason, and nothing is stored."""
    body = json.dumps({"type": "effect.write", **fields}).encode()
    stamp = str(int(time.time()))
    digest = hmac.new(STRIPE_SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256)
    signature = {"Stripe-Signature": f"t={stamp},v1={digest.hexdigest()}"}
    response = post("/hooks/stripe/", body, signature)
    if says is None:
        assert response.status_code == 202, response.content
        assert InboxMessage.objects.get().message_id == str(fields["id"])
    else:
        assert response.status_code == 400, response.content
        assert says in response.json()["error"]
        assert not InboxMessage.objects.exists()


def signed_by_stripe(body: bytes) -> dict[str, str]:
    stamp = str(int(time.time()))
    digest = hmac.new(STRIPE_SECRET.encode(), f"{stamp}.".encode() + body, hashlib.sha256)
    return {"Stripe-Signature": f"t={stamp},v1={digest.hexdigest()}"}


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
def test_nesting_past_pythons_parser_is_400_not_500(depth: int) -> None:
    """Past about 1,000 levels ``json.loads`` raises ``RecursionError``, not ``ValueError``:
    it is still the sender's bad input."""
    body = b'{"type": "effect.write", "id": "evt_deep", "d": ' + b"[" * depth + b"]" * depth + b"}"
    response = post("/hooks/stripe/", body, signed_by_stripe(body))
    assert response.status_code == 400, response.content[:300]
    assert "nested" in response.json()["error"]
    assert not InboxMessage.objects.exists()


@pytest.mark.parametrize("given", ["+5", "1_0", " 12x", "\u0661"])
def test_a_content_length_that_is_not_digits_is_400(given: str) -> None:
    body = event()
    response = Client().generic(
        "POST", "/hooks/standard/", body, content_type="application/json",
        headers=standard(body), CONTENT_LENGTH=given,
    )  # fmt: skip
    assert (response.status_code, response.json()) == (
        400,
        {"error": "Content-Length is not a number"},
    )


def test_a_sender_gone_mid_body_is_answered_without_an_error_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The socket reset under a WSGI server: Django raises ``UnreadablePostError`` from the
    read; the view answers (nobody listens) instead of logging an internal server error."""
    from django.test import RequestFactory
    from django.urls import resolve

    class Reset:
        def read(self, *args: Any) -> bytes:
            raise ConnectionResetError(104, "Connection reset by peer")

    body = event()
    request = RequestFactory().generic(
        "POST", "/hooks/standard/", body, content_type="application/json", headers=standard(body)
    )
    request._stream = Reset()  # type: ignore[attr-defined]
    with caplog.at_level("INFO", logger="django"):
        response = resolve("/hooks/standard/").func(request)
    assert response.status_code == 400
    assert "went away" in json.loads(response.content)["error"]
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert not InboxMessage.objects.exists()
