"""The routes of the webhook benchmark (``bench/webhooks.py``), served by uvicorn with
``bench.settings`` and ``BENCH_URLCONF=bench.webhook_urls``.

``/store/`` and ``/deliver/`` are ``webhook_view`` (sync, and async under ``/async/``); the
baselines ``/bare/`` (sync) and ``/async/bare/`` are what a user would write by hand: verify
the same Standard Webhooks signature, parse the JSON, and one ``INSERT … ON CONFLICT DO
NOTHING`` of the event into a table with a unique id, in autocommit. ``/floor/`` and
``/async/floor/`` answer 202 having read the body and done nothing else: the server's and
Django's own cost per request."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_inbox.contrib.webhooks import StandardWebhooks, webhook_view

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KEY = base64.b64decode(SECRET.removeprefix("whsec_"))
TABLE = "bench_webhook_event"
CREATE_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, "
    "message_id varchar(255) NOT NULL UNIQUE, event_type varchar(255) NOT NULL, "
    "payload jsonb NOT NULL, received_at timestamptz NOT NULL DEFAULT now())"
)


def _verified(request: HttpRequest) -> tuple[str, dict[str, object]] | HttpResponse:
    body = request.body
    message_id = request.headers.get("webhook-id", "")
    stamp = request.headers.get("webhook-timestamp", "")
    given = request.headers.get("webhook-signature", "")
    if not stamp.isdigit() or abs(time.time() - int(stamp)) > 300:
        return JsonResponse({"error": "stale"}, status=401)
    mac = hmac.new(KEY, f"{message_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    wanted = base64.b64encode(mac)
    if not any(
        hmac.compare_digest(entry.partition(",")[2].encode(), wanted) for entry in given.split()
    ):
        return JsonResponse({"error": "signature"}, status=401)
    return message_id, json.loads(body)


def _insert(message_id: str, payload: dict[str, object]) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {TABLE} (message_id, event_type, payload) VALUES (%s, %s, %s) "
            "ON CONFLICT (message_id) DO NOTHING",
            [message_id, payload["type"], json.dumps(payload)],
        )
        return cursor.rowcount == 1


@csrf_exempt
def bare(request: HttpRequest) -> HttpResponse:
    found = _verified(request)
    if isinstance(found, HttpResponse):
        return found
    new = _insert(*found)
    return JsonResponse({"stored": new}, status=202 if new else 200)


@csrf_exempt
async def bare_async(request: HttpRequest) -> HttpResponse:
    found = _verified(request)
    if isinstance(found, HttpResponse):
        return found
    new = await sync_to_async(_insert, thread_sensitive=True)(*found)
    return JsonResponse({"stored": new}, status=202 if new else 200)


@csrf_exempt
def floor(request: HttpRequest) -> HttpResponse:
    """The floor: Django's request cycle on this server and nothing else (the body read, no
    signature, no database)."""
    request.body  # noqa: B018
    return JsonResponse({"stored": True}, status=202)


@csrf_exempt
async def floor_async(request: HttpRequest) -> HttpResponse:
    request.body  # noqa: B018
    return JsonResponse({"stored": True}, status=202)


def _view(mode: str, asynchronous: bool):  # type: ignore[no-untyped-def]
    return webhook_view(
        consumer="bench", verify=StandardWebhooks(SECRET), mode=mode, asynchronous=asynchronous
    )


urlpatterns = [
    path("floor/", floor),
    path("async/floor/", floor_async),
    path("bare/", bare),
    path("store/", _view("store", False)),
    path("deliver/", _view("deliver", False)),
    path("async/bare/", bare_async),
    path("async/store/", _view("store", True)),
    path("async/deliver/", _view("deliver", True)),
]
