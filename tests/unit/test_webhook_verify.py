"""The signature schemes of ``django_inbox.contrib.webhooks``, checked against requests signed
by the ``standardwebhooks`` package (a client no one here wrote) and by HMACs computed here as
GitHub and Stripe document them. No database needed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook

from django_inbox.contrib.webhooks import (
    HmacSignature,
    Signed,
    StandardWebhooks,
    StripeSignature,
    Unauthorized,
)

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER = "whsec_" + "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODk="
BODY = b'{"type": "order.placed", "id": 1}'


def standard(
    secret: str = SECRET, *, message_id: str = "msg_1", at: float | None = None, body: bytes = BODY
) -> dict[str, str]:
    """Headers as a Standard Webhooks sender sends them, signed by the reference package."""
    stamp = int(time.time() if at is None else at)
    signature = Webhook(secret).sign(message_id, datetime.fromtimestamp(stamp, UTC), body.decode())
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": signature,
    }


def test_a_standard_webhook_signed_by_the_reference_package_is_accepted() -> None:
    assert StandardWebhooks(SECRET).verify(standard(), BODY) == Signed("msg_1")


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda h, b: (h, b + b" "), "no v1 signature matches"),
        (lambda h, b: ({**h, "webhook-id": "msg_2"}, b), "no v1 signature matches"),
        (
            lambda h, b: ({**h, "webhook-timestamp": str(int(h["webhook-timestamp"]) + 1)}, b),
            "no v1 signature matches",
        ),
        (lambda h, b: ({k: v for k, v in h.items() if k != "webhook-signature"}, b), "required"),
        (
            lambda h, b: ({**h, "webhook-signature": "v2," + h["webhook-signature"][3:]}, b),
            "no v1 signature matches",
        ),
    ],
    ids=["body", "id", "timestamp", "no signature", "another version"],
)
def test_tampered_standard_webhooks_are_refused(change, reason) -> None:  # type: ignore[no-untyped-def]
    headers, body = change(standard(), BODY)
    with pytest.raises(Unauthorized, match=reason):
        StandardWebhooks(SECRET).verify(headers, body)


def test_a_wrong_secret_is_refused_and_a_rotation_accepts_both() -> None:
    with pytest.raises(Unauthorized):
        StandardWebhooks(SECRET).verify(standard(OTHER), BODY)
    rotating = StandardWebhooks([SECRET, OTHER])
    assert rotating.verify(standard(OTHER), BODY) == Signed("msg_1")
    assert rotating.verify(standard(SECRET), BODY) == Signed("msg_1")


def test_several_signatures_in_one_header_any_one_will_do() -> None:
    headers = standard(SECRET)
    wrong = standard(OTHER)["webhook-signature"]
    headers["webhook-signature"] = f"{wrong} {headers['webhook-signature']}"
    assert StandardWebhooks(SECRET).verify(headers, BODY) == Signed("msg_1")


@pytest.mark.parametrize("offset", [-301, 301, -86_400])
def test_a_timestamp_outside_five_minutes_is_refused(offset: int) -> None:
    with pytest.raises(Unauthorized, match="more than 300s away"):
        StandardWebhooks(SECRET).verify(standard(at=time.time() + offset), BODY)


@pytest.mark.parametrize("shape", [" {}", "+{}", "{}\n", "-{}", "{}_0", "{}.5"], ids=repr)
def test_a_timestamp_is_ascii_digits_only(shape: str) -> None:
    """Signed as sent (the timestamp is part of what is signed), and still refused: a number
    of seconds is ASCII digits, not whatever ``int()`` would take. Other scripts' digits too."""
    now = str(int(time.time()))
    for stamp in [shape.format(now), "\u0661\u0667" + "\u0660" * 8]:
        content = f"msg_1.{stamp}.".encode() + BODY
        key = StandardWebhooks(SECRET).keys[0]
        mac = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
        headers = {
            "webhook-id": "msg_1",
            "webhook-timestamp": stamp,
            "webhook-signature": f"v1,{mac}",
        }
        with pytest.raises(Unauthorized, match="not a number of seconds"):
            StandardWebhooks(SECRET).verify(headers, BODY)


def test_a_replayed_old_signature_is_refused() -> None:
    """A captured request sent again an hour later: its signature is right, its time is not."""
    captured = standard(at=time.time())
    with pytest.raises(Unauthorized):
        StandardWebhooks(SECRET).verify(captured, BODY, now=time.time() + 3600)


def test_a_secret_that_is_not_base64_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="base64"):
        StandardWebhooks("whsec_not base64!")
    with pytest.raises(ValueError, match="empty"):
        StandardWebhooks("")


GITHUB = "It's a Secret to Everybody"


def github(body: bytes, secret: str = GITHUB) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "x-hub-signature-256": f"sha256={digest}",
        "x-github-delivery": "72d3162e",
        "x-github-event": "push",
    }


def github_verifier() -> HmacSignature:
    return HmacSignature(
        secret=GITHUB,
        header="X-Hub-Signature-256",
        prefix="sha256=",
        id_header="X-GitHub-Delivery",
        event_type_header="X-GitHub-Event",
    )


def test_githubs_documented_example_is_accepted() -> None:
    """GitHub's documentation signs "Hello, World!" with this secret to this digest."""
    headers = github(b"Hello, World!")
    assert headers["x-hub-signature-256"] == (
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    )
    assert github_verifier().verify(headers, b"Hello, World!") == Signed("72d3162e", "push")


def test_github_tampering_and_missing_parts_are_refused() -> None:
    verifier = github_verifier()
    with pytest.raises(Unauthorized, match="does not match"):
        verifier.verify(github(BODY), BODY + b"x")
    with pytest.raises(Unauthorized, match="does not match"):
        verifier.verify(github(BODY, "another secret"), BODY)
    with pytest.raises(Unauthorized, match="does not start with"):
        verifier.verify({**github(BODY), "x-hub-signature-256": "sha1=abc"}, BODY)
    headers = github(BODY)
    del headers["x-github-delivery"]
    with pytest.raises(Unauthorized, match="x-github-delivery is required"):
        verifier.verify(headers, BODY)


STRIPE = "whsec_test_stripe_endpoint_secret"


def stripe(body: bytes, *, at: float | None = None, secret: str = STRIPE) -> dict[str, str]:
    stamp = str(int(time.time() if at is None else at))
    digest = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {"stripe-signature": f"t={stamp},v1={digest},v0=ignored"}


def test_stripes_scheme_is_accepted_with_the_id_and_type_left_to_the_body() -> None:
    assert StripeSignature(STRIPE).verify(stripe(BODY), BODY) == Signed(None)


def test_stripe_signatures_of_a_rolled_secret_and_of_the_old_one_both_pass() -> None:
    headers = stripe(BODY)
    old = stripe(BODY, secret="whsec_old")["stripe-signature"].split(",")[1]
    headers["stripe-signature"] = headers["stripe-signature"] + "," + old
    assert StripeSignature(STRIPE).verify(headers, BODY) == Signed(None)
    assert StripeSignature("whsec_old").verify(headers, BODY) == Signed(None)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"stripe-signature": "v1=abc"},
        {"stripe-signature": "t=1,t=2,v1=abc"},
    ],
    ids=["none", "no time", "two times"],
)
def test_stripe_headers_without_one_time_and_a_signature_are_refused(headers) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(Unauthorized, match="one t= and a v1="):
        StripeSignature(STRIPE).verify(headers, BODY)


def test_a_stale_stripe_signature_and_a_tampered_body_are_refused() -> None:
    with pytest.raises(Unauthorized, match="more than 300s away"):
        StripeSignature(STRIPE).verify(stripe(BODY, at=time.time() - 600), BODY)
    with pytest.raises(Unauthorized, match="no v1 signature matches"):
        StripeSignature(STRIPE).verify(stripe(BODY), BODY.replace(b"1", b"2"))


def test_hex_signatures_are_taken_in_either_case() -> None:
    """Hex is hex: Stripe and GitHub-style signatures match in upper case too."""
    stamp = str(int(time.time()))
    mac = hmac.new(STRIPE.encode(), f"{stamp}.".encode() + BODY, hashlib.sha256).hexdigest()
    StripeSignature(STRIPE).verify({"stripe-signature": f"t={stamp},v1={mac.upper()}"}, BODY)
    upper = github(BODY)
    upper["x-hub-signature-256"] = "sha256=" + upper["x-hub-signature-256"][7:].upper()
    github_verifier().verify(upper, BODY)
