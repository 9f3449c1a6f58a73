"""Signed webhooks over real HTTP: uvicorn (ASGI, the test project's ``asgi.py``) and Django's
``runserver`` (WSGI) as real processes, requests signed by the ``standardwebhooks`` package
and by HMACs computed here, sent over sockets; then concurrent senders, and senders racing
``inbox_process`` workers that are SIGKILLed. Every test counts what was stored and run."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import http.client
import json
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from effects.models import Effect
from standardwebhooks import Webhook
from testproject.urls import GITHUB_SECRET, SMALL_LIMIT, STANDARD_SECRET, STRIPE_SECRET

from django_inbox.models import InboxMessage
from tests.conftest import MANAGE, ROOT, kill_at_random
from tests.effects import effect_counts, lost_and_doubled

pytestmark = pytest.mark.server_db
Status = InboxMessage.Status
#: The seconds the ASGI server gives a body (``INBOX_TEST_BODY_TIMEOUT``).
BODY_TIMEOUT = 2.0


@dataclass
class Server:
    kind: str
    port: int
    process: subprocess.Popen[str]

    def connect(self, timeout: float = 30.0) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(kind: str, env: dict[str, str]) -> Server:
    port = free_port()
    if kind == "asgi":
        command = [
            sys.executable, "-m", "uvicorn", "testproject.asgi:application",
            "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
            "--log-level", "warning",
        ]  # fmt: skip
    else:
        command = [
            sys.executable, str(MANAGE), "runserver", f"127.0.0.1:{port}",
            "--noreload", "--skip-checks",
        ]  # fmt: skip
    process = subprocess.Popen(
        command,
        env={**env, "INBOX_TEST_BODY_TIMEOUT": str(BODY_TIMEOUT)},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    server = Server(kind, port, process)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        try:
            connection = server.connect(timeout=2)
            connection.request("GET", "/hooks/standard/")
            assert connection.getresponse().status == 405
            connection.close()
            return server
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the {kind} server did not answer within 60 s")


@pytest.fixture(params=["asgi", "wsgi"])
def server(request: pytest.FixtureRequest, subprocess_env: dict[str, str]) -> Iterator[Server]:
    started = start_server(request.param, subprocess_env)
    yield started
    started.process.kill()
    started.process.communicate()


@pytest.fixture
def asgi(subprocess_env: dict[str, str]) -> Iterator[Server]:
    started = start_server("asgi", subprocess_env)
    yield started
    started.process.kill()
    started.process.communicate()


def signed(
    body: bytes, message_id: str, *, secret: str = STANDARD_SECRET, at: float | None = None
) -> dict[str, str]:
    """Standard Webhooks headers, signed by the ``standardwebhooks`` package."""
    stamp = int(time.time() if at is None else at)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": Webhook(secret).sign(
            message_id, datetime.fromtimestamp(stamp, UTC), body.decode("utf-8", "replace")
        ),
        "content-type": "application/json",
    }


def hand_signed(body: bytes, message_id: str) -> dict[str, str]:
    """Standard Webhooks headers computed here over the raw bytes (the package signs text, so
    it cannot sign a body that is not UTF-8)."""
    stamp = str(int(time.time()))
    key = base64.b64decode(STANDARD_SECRET.removeprefix("whsec_"))
    content = f"{message_id}.{stamp}.".encode() + body
    signature = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": stamp,
        "webhook-signature": f"v1,{signature}",
    }


def event(**fields: Any) -> bytes:
    return json.dumps({"type": "effect.write", **fields}).encode()


def post(
    server: Server,
    path: str,
    body: bytes,
    headers: dict[str, Any],
    connection: http.client.HTTPConnection | None = None,
) -> tuple[int, Any]:
    own = connection is None
    connection = connection or server.connect()
    try:
        connection.request("POST", path, body, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        if own:
            connection.close()


@pytest.mark.parametrize("view", ["sync", "async"])
def test_signed_requests_over_http(server: Server, view: str) -> None:
    """New, resent, tampered, replayed, wrongly signed, rotated and non-UTF-8 requests, signed
    by the ``standardwebhooks`` package, to the sync and the async view on both servers."""
    path = "/hooks/standard/" if view == "sync" else "/hooks/standard/async/"
    body = event(order=1)
    headers = signed(body, "evt_new")
    assert post(server, path, body, headers) == (202, {"stored": True, "duplicate": False})
    # The sender's retry: the same request, signed again later.
    assert post(server, path, body, signed(body, "evt_new")) == (
        200,
        {"stored": False, "duplicate": True},
    )

    refused = {
        "tampered": (event(order=2), headers),
        "replayed 10 minutes late": (body, signed(body, "evt_old", at=time.time() - 600)),
        "from the future": (body, signed(body, "evt_next", at=time.time() + 600)),
        "wrong secret": (
            body,
            signed(body, "evt_wrong", secret="whsec_" + base64.b64encode(b"x" * 24).decode()),
        ),
        "no signature": (body, {"webhook-id": "evt_none", "content-type": "application/json"}),
    }
    for name, (sent, sent_headers) in refused.items():
        status, answer = post(server, path, sent, sent_headers)
        assert status == 401, (name, status, answer)

    # A rotation: the sender signs with its new secret and the old one, the receiver still
    # knows only the old: one of the signatures matches.
    new_secret = "whsec_" + base64.b64encode(b"n" * 32).decode()
    rotated = signed(body, "evt_rotated")
    rotated["webhook-signature"] = " ".join(
        [
            signed(body, "evt_rotated", secret=new_secret)["webhook-signature"],
            rotated["webhook-signature"],
        ]
    )
    assert post(server, path, body, rotated)[0] == 202

    # An id in UTF-8 (servers decode headers as Latin-1; the view takes the bytes back).
    utf8_id = "évt_ü"
    utf8 = hand_signed(body, utf8_id)
    sent_headers: dict[str, Any] = {**utf8, "webhook-id": utf8_id.encode()}
    assert post(server, path, body, sent_headers)[0] == 202

    not_utf8 = b'{"type": "effect.write", "name": "\xff\xfe"}'
    status, answer = post(server, path, not_utf8, hand_signed(not_utf8, "evt_latin"))
    assert (status, answer) == (400, {"error": "the body is not UTF-8"})
    not_json = b"type=effect.write"
    assert post(server, path, not_json, signed(not_json, "evt_form"))[0] == 400
    no_type = json.dumps({"order": 3}).encode()
    assert post(server, path, no_type, signed(no_type, "evt_untyped"))[0] == 400

    stored = set(InboxMessage.objects.values_list("message_id", flat=True))
    assert stored == {"evt_new", "evt_rotated", "évt_ü"}, "nothing is stored for a 4xx"


def test_hand_computed_hmacs_of_github_and_stripe(server: Server) -> None:
    body = json.dumps({"action": "opened", "number": 7}).encode()
    digest = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    github = {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "X-GitHub-Event": "effect.write",
        "content-type": "application/json",
    }
    assert post(server, "/hooks/github/", body, github)[0] == 202
    assert post(server, "/hooks/github/", body, github)[0] == 200
    assert post(server, "/hooks/github/", body + b" ", github)[0] == 401

    stripe_body = json.dumps({"id": "evt_1NG8Du2eZvKYlo2C", "type": "effect.write"}).encode()
    stamp = str(int(time.time()))
    mac = hmac.new(STRIPE_SECRET.encode(), stamp.encode() + b"." + stripe_body, hashlib.sha256)
    stripe = {"Stripe-Signature": f"t={stamp},v1={mac.hexdigest()}"}
    assert post(server, "/hooks/stripe/", stripe_body, stripe)[0] == 202
    old = str(int(time.time()) - 3600)
    stale = hmac.new(STRIPE_SECRET.encode(), old.encode() + b"." + stripe_body, hashlib.sha256)
    replayed = {"Stripe-Signature": f"t={old},v1={stale.hexdigest()}"}
    assert post(server, "/hooks/stripe/", stripe_body, replayed)[0] == 401

    assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == [
        "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "evt_1NG8Du2eZvKYlo2C",
    ]


def raw_request(server: Server, head: bytes, send: Callable[[socket.socket], None]) -> bytes:
    """Send ``head`` then whatever ``send`` sends (it may stop early), and read the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head)
        # The server may answer and close while we still send: then read what it said.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            send(sock)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body


def head_of(path: str, body_headers: dict[str, str], extra: str) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: 127.0.0.1",
        *(f"{k}: {v}" for k, v in body_headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def test_a_huge_declared_body_is_refused_before_it_is_read(server: Server) -> None:
    """50 MB declared, 64 KiB sent: the answer is 413 while the sender has sent almost none
    of it (the server never waits for the rest)."""
    headers = signed(b"", "evt_huge")
    sent = {"bytes": 0}

    def some(sock: socket.socket) -> None:
        sock.sendall(b"x" * 65536)
        sent["bytes"] += 65536

    answer = raw_request(
        server, head_of("/hooks/standard/", headers, f"Content-Length: {50 * 2**20}\r\n"), some
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent["bytes"] == 65536
    assert not InboxMessage.objects.exists()


def test_chunked_and_slow_bodies_under_asgi(asgi: Server) -> None:
    """A chunked body that grows past the limit (4 KiB on this route) is refused once it
    does; a slow body that arrives in time is taken; a stalled one is answered 408."""
    headers = signed(b"", "evt_chunked")

    def endless(sock: socket.socket) -> None:
        for _ in range(64):  # 64 KiB if nobody stops it
            sock.sendall(b"400\r\n" + b"x" * 1024 + b"\r\n")
            time.sleep(0.01)

    answer = raw_request(
        asgi, head_of("/hooks/standard/small/", headers, "Transfer-Encoding: chunked\r\n"), endless
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert f"larger than {SMALL_LIMIT} bytes".encode() in answer

    # Without its slash, the path Django would redirect to a webhook view has its limit too.
    answer = raw_request(
        asgi,
        head_of("/hooks/standard/small", headers, f"Content-Length: {30 * 2**20}\r\n"),
        lambda sock: sock.sendall(b"x" * 65536),
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]

    # Paths that are not a webhook view's pass through untouched, whatever their body.
    admin = raw_request(
        asgi,
        head_of("/admin/login/", {}, "Transfer-Encoding: chunked\r\n"),
        lambda sock: sock.sendall((b"2000\r\n" + b"x" * 8192 + b"\r\n") * 4 + b"0\r\n\r\n"),
    )
    assert admin.startswith(b"HTTP/1.1 403"), admin[:200]  # Django's CSRF answer, not ours

    body = event(slow=True)
    slow_headers = signed(body, "evt_slow")
    # A hand-made HMAC signs the same, or the package and this test disagree on the scheme.
    assert (
        post(asgi, "/hooks/standard/async/", event(x=1), hand_signed(event(x=1), "evt_hand"))[0]
        == 202
    )
    pieces = [body[i : i + 8] for i in range(0, len(body), 8)]

    def slowly(sock: socket.socket) -> None:
        for piece in pieces:
            sock.sendall(piece)
            time.sleep(BODY_TIMEOUT / (2 * len(pieces)))  # all of it within the timeout

    answer = raw_request(
        asgi,
        head_of("/hooks/standard/async/", slow_headers, f"Content-Length: {len(body)}\r\n"),
        slowly,
    )
    assert answer.startswith(b"HTTP/1.1 202"), answer[:200]

    stalled_headers = signed(body, "evt_stalled")
    answer = raw_request(
        asgi,
        head_of("/hooks/standard/async/", stalled_headers, f"Content-Length: {len(body)}\r\n"),
        lambda sock: sock.sendall(body[:10]),  # then nothing
    )
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert f"did not arrive within {BODY_TIMEOUT:g}s".encode() in answer
    assert sorted(InboxMessage.objects.values_list("message_id", flat=True)) == [
        "evt_hand",
        "evt_slow",
    ]


def send_all(
    server: Server, path: str, plan: list[tuple[str, bytes]], results: list[tuple[str, int, Any]]
) -> None:
    """One sender: post each (message id, body) of ``plan`` on one kept-alive connection."""
    connection = server.connect()
    try:
        for message_id, body in plan:
            status, answer = post(server, path, body, signed(body, message_id), connection)
            results.append((message_id, status, answer))
    finally:
        connection.close()


def run_senders(
    server: Server, path: str, plans: list[list[tuple[str, bytes]]]
) -> list[tuple[str, int, Any]]:
    results: list[tuple[str, int, Any]] = []
    threads = [
        threading.Thread(target=send_all, args=(server, path, plan, results)) for plan in plans
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not any(thread.is_alive() for thread in threads)
    return results


@pytest.mark.parametrize("path", ["/hooks/standard/async/deliver/", "/hooks/standard/deliver/"])
def test_concurrent_senders_of_the_same_ids_deliver_once(asgi: Server, path: str) -> None:
    """8 senders post the same 100 events at once to a view that processes them inline: one
    effect each, whichever request won."""
    ids = [f"evt_{n}" for n in range(100)]
    plans = []
    for sender in range(8):
        order = ids[:]
        random.Random(sender).shuffle(order)
        plans.append([(message_id, event(n=message_id)) for message_id in order])

    results = run_senders(asgi, path, plans)

    assert len(results) == 800
    statuses = Counter(status for _, status, _ in results)
    assert set(statuses) <= {200, 202}, statuses
    processed = Counter(mid for mid, _, answer in results if answer == {"outcome": "processed"})
    assert processed == Counter({message_id: 1 for message_id in ids})
    lost, doubled = lost_and_doubled(set(ids))
    print(f"8 senders x 100 ids at {path}: lost={lost} doubled={doubled} statuses={dict(statuses)}")
    assert (lost, doubled) == (0, 0)


@pytest.mark.slow
def test_senders_racing_killed_workers(
    asgi: Server, manage: Callable[..., subprocess.Popen[str]]
) -> None:
    """8 senders post 1,000 events (each event to two senders, 30% of them sent again by the
    same sender) to the async store view while two ``inbox_process`` workers are SIGKILLed at
    random 10 times: each event stored once (one 202 each), run once (lost 0, doubled 0)."""
    rng = random.Random(30)
    ids = [f"evt_{n:04d}" for n in range(1000)]
    plans: list[list[tuple[str, bytes]]] = [[] for _ in range(8)]
    for message_id in ids:
        for sender in rng.sample(range(8), 2):
            copies = 2 if rng.random() < 0.3 else 1
            plans[sender].extend([(message_id, event(n=message_id))] * copies)
    for plan in plans:
        rng.shuffle(plan)
    sent = sum(len(plan) for plan in plans)

    results: list[tuple[str, int, Any]] = []
    senders = threading.Thread(
        target=lambda: results.extend(run_senders(asgi, "/hooks/standard/async/", plans))
    )
    senders.start()
    worker_env = {"EFFECTS_MAX_ATTEMPTS": "20"}  # more than the kills: no row dies of them
    kills = kill_at_random(
        lambda: manage(
            "inbox_process", "--consumer", "effects", "--until-idle", "4", env=worker_env
        ),
        rng,
        kills=10,
        pause=(0.5, 1.5),
    )
    senders.join(timeout=600)
    # Rows of the last killed workers come back after their lease: drain them.
    drain = manage("inbox_process", "--consumer", "effects", "--until-idle", "4", env=worker_env)
    _, err = drain.communicate(timeout=300)
    assert drain.returncode == 0, err[-3000:]

    assert len(results) == sent
    statuses = Counter(status for _, status, _ in results)
    assert set(statuses) == {200, 202}, statuses
    stored = Counter(mid for mid, status, _ in results if status == 202)
    assert stored == Counter({message_id: 1 for message_id in ids}), "one 202 per event"
    rows = Counter(InboxMessage.objects.values_list("status", flat=True))
    lost, doubled = lost_and_doubled(set(ids))
    print(
        f"webhooks under worker chaos: {sent} requests for 1000 events, kills={kills}, "
        f"statuses={dict(statuses)}, rows={dict(rows)}, lost={lost} doubled={doubled}, "
        f"effects={Effect.objects.count()}"
    )
    assert kills == 10
    assert rows == {Status.COMPLETED: 1000}
    assert (lost, doubled) == (0, 0)
    assert len(effect_counts()) == 1000
