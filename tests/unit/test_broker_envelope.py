"""``parse()`` on real kombu messages, published to and read back from kombu's in-memory transport.

No broker and no database: every message goes through ``Producer.publish`` (or, for a message
without a content type, the channel's own ``basic_publish``) and comes back as the
``kombu.transport.virtual.Message`` a consumer would see.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from kombu import Connection, Queue
from kombu.message import Message

from django_inbox.broker.envelope import RAW_LIMIT, Envelope, parse

JSON = "application/json"
CLOUDEVENTS = "application/cloudevents+json"
UNSET = object()


def kombu_message(
    body: Any = b"{}",
    *,
    content_type: str | None = JSON,
    content_encoding: str | None = "utf-8",
    headers: dict[str, Any] | None = None,
    **properties: Any,
) -> Message:
    """Publish one message to a fresh in-memory queue and read it back as kombu hands it out.

    ``body`` may be bytes, text or any JSON value (encoded here as UTF-8 JSON text).
    ``content_type=None`` publishes through the channel, so the message carries no content
    type at all (``Producer.publish`` would label a bytes body ``application/data``).
    """
    if not isinstance(body, bytes | str):
        body = json.dumps(body).encode("utf-8")
    name = "envelope-" + uuid.uuid4().hex
    queue = Queue(name, routing_key=name)
    with Connection("memory://") as connection:
        channel = connection.default_channel
        bound = queue(channel)
        bound.declare()
        if content_type is None:
            raw = body.encode("utf-8") if isinstance(body, str) else body
            prepared = channel.prepare_message(
                raw,
                content_type=None,
                content_encoding=content_encoding,
                headers=headers or {},
                properties=properties,
            )
            channel.basic_publish(prepared, exchange="", routing_key=name)
        else:
            connection.Producer().publish(
                body,
                routing_key=name,
                content_type=content_type,
                content_encoding=content_encoding,
                headers=headers or {},
                **properties,
            )
        message = bound.get(no_ack=True)
        bound.delete()
    assert message is not None, "the in-memory transport lost the message"
    return message


def parsed(body: Any = b"{}", *, raw_limit: int = RAW_LIMIT, **options: Any) -> Envelope:
    return parse(kombu_message(body, **options), raw_limit=raw_limit)


def cloudevent(**attributes: Any) -> dict[str, Any]:
    event = {
        "specversion": "1.0",
        "id": "ce-1",
        "source": "/orders",
        "type": "order.created",
        "data": {"order": 7},
    }
    event.update(attributes)
    return {k: v for k, v in event.items() if v is not UNSET}


# -- the helper ---------------------------------------------------------------------------


def test_helper_reads_back_a_real_kombu_message() -> None:
    message = kombu_message(
        b'{"a": 1}', headers={"h": "v"}, message_id="m-1", type="t.x", app_id="app"
    )

    assert isinstance(message, Message)
    assert (message.body, message.content_type, message.content_encoding) == (
        b'{"a": 1}',
        JSON,
        "utf-8",
    )
    assert message.headers == {"h": "v"}
    assert {k: message.properties[k] for k in ("message_id", "type", "app_id")} == {
        "message_id": "m-1",
        "type": "t.x",
        "app_id": "app",
    }


def test_helper_can_publish_without_a_content_type() -> None:
    message = kombu_message(b'{"id": "x"}', content_type=None, content_encoding=None)

    assert (message.body, message.content_type, message.content_encoding) == (
        b'{"id": "x"}',
        None,
        None,
    )


# -- identity -----------------------------------------------------------------------------


def test_amqp_message_id_property_wins_over_every_other_id() -> None:
    envelope = parsed(
        {"id": "body-id", "type": "t"},
        message_id="property-id",
        headers={"message_id": "header-id", "ce-id": "ce-id", "ce-source": "/src"},
    )

    assert envelope.message_id == "property-id"


@pytest.mark.parametrize(
    ("headers", "body", "expected"),
    [
        pytest.param(
            {"message_id": "header-id", "ce-id": "ce-id", "ce-source": "/src"},
            {"id": "body-id"},
            "header-id",
            id="message_id-header-beats-ce-id-and-body",
        ),
        pytest.param(
            {"ce-id": "ce-id", "ce-source": "/src"},
            {"id": "body-id"},
            "/src#ce-id",
            id="ce-id-with-source-beats-body",
        ),
        pytest.param(
            {"ce_id": "ce-id", "ce_source": "/src"},
            {"id": "body-id"},
            "/src#ce-id",
            id="ce_id-underscore-with-source",
        ),
        pytest.param(
            {"ce-id": "ce-id"},
            {"id": "body-id"},
            "ce-id",
            id="ce-id-without-source-as-is",
        ),
        pytest.param(
            {"ce-id": "dash", "ce_id": "underscore", "ce-source": "/src"},
            {},
            "/src#dash",
            id="ce-id-beats-ce_id",
        ),
        pytest.param({}, {"id": "body-id"}, "body-id", id="body-id"),
        pytest.param({}, {"id": 42}, "42", id="numeric-body-id-as-text"),
        pytest.param(
            {"message_id": "", "ce-id": ""}, {"id": "body-id"}, "body-id", id="empty-headers"
        ),
    ],
)
def test_message_id_precedence_without_the_property(
    headers: dict[str, Any], body: dict[str, Any], expected: str
) -> None:
    assert parsed(body, headers=headers).message_id == expected


def test_a_ce_id_header_is_not_prefixed_with_the_app_id() -> None:
    envelope = parsed({}, headers={"ce-id": "e-1"}, app_id="billing")

    assert (envelope.message_id, envelope.source) == ("e-1", "billing")


def test_a_bytes_message_id_header_is_read_as_text() -> None:
    assert parsed({}, headers={"message_id": b"from-amqp-table"}).message_id == "from-amqp-table"


@pytest.mark.parametrize("content_type", [CLOUDEVENTS, JSON, None])
def test_structured_cloudevent_identity_is_source_and_id(content_type: str | None) -> None:
    envelope = parsed(cloudevent(id="e-9", source="/orders"), content_type=content_type)

    assert envelope.message_id == "/orders#e-9"


def test_structured_cloudevent_without_source_uses_its_id() -> None:
    assert parsed(cloudevent(source=UNSET), content_type=CLOUDEVENTS).message_id == "ce-1"


def test_cloudevent_source_header_prefixes_a_structured_id() -> None:
    envelope = parsed(cloudevent(source=UNSET), headers={"ce-source": "/hdr"})

    assert envelope.message_id == "/hdr#ce-1"


def test_a_plain_json_body_id_is_used_as_is_even_beside_a_source_field() -> None:
    # Without "specversion" the body is no CloudEvent: its "source" is just data.
    envelope = parsed({"id": "order-1", "source": "/shop", "type": "order.created"})

    assert envelope.message_id == "order-1"


def test_the_same_message_published_twice_gets_the_same_id() -> None:
    # Stable across producer retries and redeliveries: nothing is invented on arrival.
    first = parsed(cloudevent(), content_type=CLOUDEVENTS)
    second = parsed(cloudevent(), content_type=CLOUDEVENTS)

    assert first.message_id == second.message_id == "/orders#ce-1"


@pytest.mark.parametrize(
    ("body", "options"),
    [
        pytest.param({"type": "t", "order": 1}, {}, id="json-object-without-id"),
        pytest.param([{"id": "in-a-list"}], {}, id="json-array"),
        pytest.param("just text", {}, id="json-string"),
        pytest.param({"id": None, "type": "t"}, {}, id="null-id"),
        pytest.param({"id": {"nested": 1}}, {}, id="object-id"),
        pytest.param({"id": True}, {}, id="boolean-id"),
        pytest.param({"id": ""}, {}, id="empty-id"),
        pytest.param(b"<order id='1'/>", {"content_type": "application/xml"}, id="xml"),
        pytest.param(
            cloudevent(id=UNSET), {"content_type": CLOUDEVENTS}, id="cloudevent-without-id"
        ),
        pytest.param({}, {"headers": {"message_id": True}}, id="boolean-header"),
    ],
)
def test_no_id_anywhere_gives_no_message_id(body: Any, options: dict[str, Any]) -> None:
    assert parsed(body, **options).message_id is None


def test_an_undecodable_body_keeps_the_message_id_property() -> None:
    envelope = parsed(b"not json", message_id="m-7")

    assert (envelope.message_id, envelope.problem is not None) == ("m-7", True)


# -- event type ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("properties", "headers", "body", "content_type", "expected"),
    [
        pytest.param(
            {"type": "prop.type"},
            {"ce-type": "ce.dash", "ce_type": "ce.under", "event_type": "header.type"},
            cloudevent(type="ce.body"),
            CLOUDEVENTS,
            "prop.type",
            id="type-property-wins",
        ),
        pytest.param(
            {},
            {"ce-type": "ce.dash", "ce_type": "ce.under", "event_type": "header.type"},
            cloudevent(type="ce.body"),
            CLOUDEVENTS,
            "ce.dash",
            id="ce-type-header",
        ),
        pytest.param(
            {},
            {"ce_type": "ce.under", "event_type": "header.type"},
            {"id": "1", "type": "body.type"},
            JSON,
            "ce.under",
            id="ce_type-header",
        ),
        pytest.param(
            {},
            {"event_type": "header.type"},
            cloudevent(type="ce.body"),
            CLOUDEVENTS,
            "header.type",
            id="event_type-header-beats-structured-type",
        ),
        pytest.param(
            {}, {}, cloudevent(type="ce.body"), CLOUDEVENTS, "ce.body", id="structured-type"
        ),
        pytest.param(
            {}, {}, {"id": "1", "type": "body.type"}, JSON, "body.type", id="plain-body-type"
        ),
        pytest.param(
            {}, {"event_type": ""}, {"id": "1", "type": "body.type"}, JSON, "body.type", id="empty"
        ),
        pytest.param({}, {}, {"id": "1"}, JSON, None, id="no-type"),
        pytest.param({}, {}, {"id": "1", "type": {"a": 1}}, JSON, None, id="object-type"),
        pytest.param({}, {}, [1, 2], JSON, None, id="array-body"),
    ],
)
def test_event_type_precedence(
    properties: dict[str, Any],
    headers: dict[str, Any],
    body: Any,
    content_type: str,
    expected: str | None,
) -> None:
    envelope = parsed(body, content_type=content_type, headers=headers, **properties)

    assert envelope.event_type == expected


def test_an_undecodable_body_keeps_the_type_from_properties_and_headers() -> None:
    assert parsed(b"<x/>", content_type="application/xml", type="t.x").event_type == "t.x"
    assert parsed(b"{", headers={"ce-type": "t.y"}).event_type == "t.y"


# -- structured CloudEvents ---------------------------------------------------------------


@pytest.mark.parametrize("content_type", [CLOUDEVENTS, JSON])
def test_structured_cloudevent_payload_is_its_data(content_type: str) -> None:
    envelope = parsed(cloudevent(data={"order": 7, "lines": [1, 2]}), content_type=content_type)

    assert envelope.payload == {"order": 7, "lines": [1, 2]}


@pytest.mark.parametrize("data", [[1, 2, 3], "text data", 0, False])
def test_structured_cloudevent_data_of_any_json_kind_is_the_payload(data: Any) -> None:
    assert parsed(cloudevent(data=data), content_type=CLOUDEVENTS).payload == data


def test_structured_cloudevent_data_base64_is_kept_as_is() -> None:
    encoded = base64.b64encode(b"\x00\x01binary").decode("ascii")
    event = cloudevent(data=UNSET, data_base64=encoded)

    envelope = parsed(event, content_type=CLOUDEVENTS)

    assert envelope.payload == {"data_base64": encoded}
    assert envelope.problem is None


def test_structured_cloudevent_attributes_are_kept_in_the_headers() -> None:
    event = cloudevent(
        subject="order/7", time="2024-05-01T12:00:00Z", partitionkey="customer-3", extra=1
    )

    envelope = parsed(event, content_type=CLOUDEVENTS, headers={"trace": "abc"})

    assert envelope.headers == {
        "trace": "abc",
        "cloudevent": {
            "specversion": "1.0",
            "id": "ce-1",
            "source": "/orders",
            "type": "order.created",
            "subject": "order/7",
            "time": "2024-05-01T12:00:00Z",
            "partitionkey": "customer-3",
            "extra": 1,
        },
    }


def test_structured_cloudevent_attributes_leave_out_data_base64() -> None:
    event = cloudevent(data=UNSET, data_base64="AAE=")

    assert "data_base64" not in parsed(event, content_type=CLOUDEVENTS).headers["cloudevent"]


def test_structured_cloudevent_gives_source_and_partition_key() -> None:
    envelope = parsed(cloudevent(partitionkey="customer-3"), content_type=CLOUDEVENTS)

    assert (envelope.source, envelope.key) == ("/orders", "customer-3")


def test_cloudevents_content_type_with_parameters_is_structured() -> None:
    envelope = parsed(cloudevent(), content_type="application/cloudevents+json; charset=utf-8")

    assert (envelope.message_id, envelope.payload) == ("/orders#ce-1", {"order": 7})


def test_a_json_body_with_specversion_but_no_id_is_not_a_cloudevent() -> None:
    envelope = parsed({"specversion": "1.0", "type": "t", "data": {"x": 1}})

    assert (envelope.payload, "cloudevent" in envelope.headers) == (
        {"specversion": "1.0", "type": "t", "data": {"x": 1}},
        False,
    )


# -- binary CloudEvents -------------------------------------------------------------------


def binary_headers(**extra: Any) -> dict[str, Any]:
    return {
        "ce-specversion": "1.0",
        "ce-id": "b-1",
        "ce-source": "/inventory",
        "ce-type": "stock.changed",
        **extra,
    }


def test_binary_cloudevent_payload_is_the_body() -> None:
    envelope = parsed({"sku": "A-1", "delta": -2}, headers=binary_headers())

    assert envelope.payload == {"sku": "A-1", "delta": -2}


def test_binary_cloudevent_reads_identity_type_source_from_ce_headers() -> None:
    envelope = parsed({"sku": "A-1", "id": "body-id"}, headers=binary_headers())

    assert (envelope.message_id, envelope.event_type, envelope.source) == (
        "/inventory#b-1",
        "stock.changed",
        "/inventory",
    )


def test_binary_cloudevent_headers_are_kept_without_a_cloudevent_section() -> None:
    envelope = parsed({"sku": "A-1"}, headers=binary_headers())

    assert envelope.headers == binary_headers()


def test_binary_cloudevent_with_underscore_headers() -> None:
    headers = {"ce_id": "b-2", "ce_source": "/kafka-style", "ce_type": "t.k"}

    envelope = parsed({"v": 1}, headers=headers)

    assert (envelope.message_id, envelope.event_type, envelope.source, envelope.payload) == (
        "/kafka-style#b-2",
        "t.k",
        "/kafka-style",
        {"v": 1},
    )


# -- content types and bodies ---------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json",
        "text/json",
        "application/vnd.x+json",
        "application/json; charset=utf-8",
        "Application/JSON",
        " application/json ",
        None,
    ],
)
def test_json_content_types_are_decoded(content_type: str | None) -> None:
    envelope = parsed({"id": "1", "type": "t", "n": 1.5}, content_type=content_type)

    assert (envelope.problem, envelope.payload) == (None, {"id": "1", "type": "t", "n": 1.5})


@pytest.mark.parametrize("body", [b'{"a": 1}', '{"a": 1}'])
def test_text_and_bytes_bodies_decode_alike(body: bytes | str) -> None:
    assert parsed(body).payload == {"a": 1}


def test_non_ascii_json_is_decoded() -> None:
    body = json.dumps({"name": "Zoë ☃ 🚀"}, ensure_ascii=False).encode("utf-8")

    assert parsed(body).payload == {"name": "Zoë ☃ 🚀"}


@pytest.mark.parametrize("encoding", ["binary", "8bit", "7bit", "UTF-8", "utf8", None])
def test_transfer_encodings_read_as_utf8(encoding: str | None) -> None:
    envelope = parsed('{"name": "Zoë"}'.encode(), content_encoding=encoding)

    assert (envelope.problem, envelope.payload) == (None, {"name": "Zoë"})


def test_a_declared_latin1_body_is_decoded_with_it() -> None:
    envelope = parsed('{"name": "Zoë"}'.encode("latin-1"), content_encoding="latin-1")

    assert (envelope.problem, envelope.payload) == (None, {"name": "Zoë"})


def test_an_unknown_content_encoding_is_a_problem() -> None:
    envelope = parsed(b'{"a": 1}', content_encoding="x-no-such-charset", message_id="m")

    assert "not valid x-no-such-charset text" in envelope.problem


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/xml", b"<order id='1'>\xc3\xa9</order>"),
        ("text/plain", b"hello, world"),
        ("application/data", b'{"id": "looks like json"}'),  # kombu's label for raw bytes
        ("application/x-python-serialize", b"\x80\x04K\x01."),
    ],
)
def test_unsupported_content_types_are_a_problem(content_type: str, body: bytes) -> None:
    envelope = parsed(body, content_type=content_type, message_id="m")

    assert envelope.problem is not None
    assert envelope.problem.startswith(f"unsupported content type {content_type!r}")


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/xml", "<order id='1'>é</order>".encode()),
        ("text/plain", b"hello, world"),
    ],
)
def test_unsupported_content_type_keeps_the_raw_text(content_type: str, body: bytes) -> None:
    envelope = parsed(body, content_type=content_type, message_id="m")

    assert envelope.payload == {
        "raw": body.decode("utf-8"),
        "raw_encoding": "utf-8",
        "content_type": content_type,
        "bytes": len(body),
    }


def test_unsupported_content_type_is_lowercased_without_parameters_in_the_payload() -> None:
    envelope = parsed(b"<a/>", content_type="Application/XML; charset=utf-8", message_id="m")

    assert envelope.payload["content_type"] == "application/xml"


@pytest.mark.parametrize("content_type", [JSON, "application/octet-stream"])
def test_non_utf8_bytes_are_kept_as_base64(content_type: str) -> None:
    body = b'{"id": "\xff\xfe\x00\x81"}'

    envelope = parsed(body, content_type=content_type, message_id="m")

    assert envelope.problem is not None
    assert envelope.payload["raw_encoding"] == "base64"
    assert base64.b64decode(envelope.payload["raw"]) == body
    assert envelope.payload["bytes"] == len(body)


def test_non_utf8_json_body_problem_names_the_charset() -> None:
    envelope = parsed(b"\xff\xfe{}", message_id="m")

    assert envelope.problem is not None
    assert envelope.problem.startswith("body is not valid utf-8 text")


@pytest.mark.parametrize(
    "body",
    [b"{", b"not json", b"", b"{'single': 'quotes'}", b'{"a": 1} trailing', b"[1, 2,]"],
)
def test_invalid_json_is_a_problem_with_the_raw_body(body: bytes) -> None:
    envelope = parsed(body, message_id="m")

    assert envelope.problem is not None
    assert envelope.problem.startswith("body is not valid JSON")
    assert envelope.payload == {
        "raw": body.decode(),
        "raw_encoding": "utf-8",
        "content_type": JSON,
        "bytes": len(body),
    }


@pytest.mark.parametrize(
    "body",
    [
        b'{"id": "1", "x": NaN}',
        b'{"id": "1", "x": Infinity}',
        b'{"id": "1", "x": -Infinity}',
        b"[NaN]",
        b"Infinity",
    ],
)
def test_nan_and_infinity_are_refused(body: bytes) -> None:
    envelope = parsed(body, message_id="m")

    assert envelope.problem is not None
    assert "not valid JSON" in envelope.problem
    assert envelope.payload["raw"] == body.decode()


@pytest.mark.parametrize("number", [b"1e999", b"-1e999"])
def test_a_number_overflowing_to_infinity_is_refused(number: bytes) -> None:
    envelope = parsed(b'{"id": "1", "type": "t", "x": ' + number + b"}", message_id="m")

    assert envelope.problem is not None
    assert envelope.payload["raw"].endswith(number.decode() + "}")


def test_very_deeply_nested_json_is_a_problem_not_a_crash() -> None:
    body = b"[" * 100_000 + b"]" * 100_000

    envelope = parsed(body, message_id="m", raw_limit=16)

    assert envelope.problem is not None
    assert "not valid JSON" in envelope.problem


def test_a_body_over_the_raw_limit_is_cut_with_the_full_size() -> None:
    body = b"<big>" + b"x" * 1000 + b"</big>"

    envelope = parsed(body, content_type="application/xml", message_id="m", raw_limit=100)

    assert envelope.payload == {
        "raw": body[:100].decode(),
        "raw_encoding": "utf-8",
        "content_type": "application/xml",
        "bytes": len(body),
        "truncated": True,
    }


def test_a_base64_body_over_the_raw_limit_is_cut_before_encoding() -> None:
    body = bytes(range(256)) * 4

    envelope = parsed(body, content_type="application/octet-stream", message_id="m", raw_limit=10)

    assert base64.b64decode(envelope.payload["raw"]) == body[:10]
    assert (envelope.payload["bytes"], envelope.payload["truncated"]) == (1024, True)


@pytest.mark.parametrize("size", [99, 100])
def test_a_body_within_the_raw_limit_is_not_marked_truncated(size: int) -> None:
    body = b"y" * size

    envelope = parsed(body, content_type="text/plain", message_id="m", raw_limit=100)

    assert envelope.payload == {
        "raw": body.decode(),
        "raw_encoding": "utf-8",
        "content_type": "text/plain",
        "bytes": size,
    }


def test_a_zero_raw_limit_keeps_only_the_size() -> None:
    envelope = parsed(b"abc", content_type="text/plain", message_id="m", raw_limit=0)

    assert envelope.payload == {
        "raw": "",
        "raw_encoding": "utf-8",
        "content_type": "text/plain",
        "bytes": 3,
        "truncated": True,
    }


def test_a_text_body_cut_inside_a_character_is_still_kept_as_text() -> None:
    body = ("<note>" + "é" * 100 + "</note>").encode()  # "é" is two bytes

    envelope = parsed(body, content_type="application/xml", message_id="m", raw_limit=7)

    assert envelope.payload["raw_encoding"] == "utf-8"
    assert body.startswith(envelope.payload["raw"].encode())


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("text/plain", b"before\x00after"),
        (JSON, b'{"id": "a\x00b"}'),  # a raw control character is not valid JSON either
    ],
)
def test_a_nul_byte_in_utf8_text_is_kept_as_base64(content_type: str, body: bytes) -> None:
    envelope = parsed(body, content_type=content_type, message_id="m")

    assert envelope.problem is not None
    assert envelope.payload["raw_encoding"] == "base64"
    assert base64.b64decode(envelope.payload["raw"]) == body


# -- redelivery ---------------------------------------------------------------------------


def test_a_first_delivery_is_not_redelivered() -> None:
    assert parsed({"id": "1"}).redelivered is False


def test_delivery_info_redelivered_is_redelivered() -> None:
    message = kombu_message({"id": "1"})
    message.delivery_info["redelivered"] = True

    assert parse(message).redelivered is True


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"redelivered": True}, True, id="redis-transport-header"),
        pytest.param({"redelivered": False}, False, id="redis-header-false"),
        pytest.param({"redelivered": "yes"}, False, id="redis-header-not-a-bool"),
        pytest.param({"x-delivery-count": 1}, True, id="quorum-count-1"),
        pytest.param({"x-delivery-count": 5}, True, id="quorum-count-5"),
        pytest.param({"x-delivery-count": "2"}, True, id="quorum-count-text"),
        pytest.param({"x-delivery-count": b"3"}, True, id="quorum-count-bytes"),
        pytest.param({"x-delivery-count": Decimal("2")}, True, id="quorum-count-decimal"),
        pytest.param({"x-delivery-count": 0}, False, id="quorum-count-0"),
        pytest.param({"x-delivery-count": -1}, False, id="quorum-count-negative"),
        pytest.param({"x-delivery-count": "garbage"}, False, id="quorum-count-garbage"),
        pytest.param({"x-delivery-count": None}, False, id="quorum-count-null"),
        pytest.param({"x-delivery-count": [1]}, False, id="quorum-count-list"),
        pytest.param({"x-delivery-count": {"n": 1}}, False, id="quorum-count-dict"),
    ],
)
def test_redelivered_from_headers(headers: dict[str, Any], expected: bool) -> None:
    assert parsed({"id": "1"}, headers=headers).redelivered is expected


# -- headers ------------------------------------------------------------------------------


def test_headers_are_made_json_safe() -> None:
    headers = {
        "text": "plain",
        "number": 3,
        "flag": True,
        "none": None,
        "bytes": b"caf\xc3\xa9",
        "when": datetime(2024, 5, 1, 12, 30, tzinfo=UTC),
        "naive": datetime(2024, 5, 1, 12, 30),
        "day": date(2024, 5, 1),
        "amount": Decimal("12.50"),
        "nested": {"list": [b"x", Decimal("1.1"), {"deep": datetime(2020, 1, 1)}]},
        "tuple": (1, b"y"),
    }

    envelope = parsed({"id": "1"}, headers=headers)

    assert envelope.headers == {
        "text": "plain",
        "number": 3,
        "flag": True,
        "none": None,
        "bytes": "café",
        "when": "2024-05-01T12:30:00+00:00",
        "naive": "2024-05-01T12:30:00",
        "day": "2024-05-01",
        "amount": "12.50",
        "nested": {"list": ["x", "1.1", {"deep": "2020-01-01T00:00:00"}]},
        "tuple": [1, "y"],
    }


def test_json_safe_headers_survive_strict_json_encoding() -> None:
    headers = {
        "bytes": b"\x00\xff",
        "when": datetime(2024, 5, 1),
        "amount": Decimal("1"),
        "nan": float("nan"),
        "nested": [{"b": b"z"}],
    }

    envelope = parsed({"id": "1"}, headers=headers)

    assert json.loads(json.dumps(envelope.headers, allow_nan=False)) == envelope.headers


def test_non_utf8_bytes_in_a_header_become_hex() -> None:
    assert parsed({"id": "1"}, headers={"blob": b"\xff\x00\x10"}).headers["blob"] == "ff0010"


def test_a_nan_header_becomes_null() -> None:
    assert parsed({"id": "1"}, headers={"ratio": float("nan")}).headers == {"ratio": None}


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_an_infinite_header_is_made_json_safe(value: float) -> None:
    envelope = parsed({"id": "1"}, headers={"ratio": value, "nested": [value]})

    json.dumps(envelope.headers, allow_nan=False)


def test_header_keys_are_text() -> None:
    assert list(parsed({"id": "1"}, headers={"x-retry": 1}).headers) == ["x-retry"]


def test_a_message_without_headers_has_empty_headers() -> None:
    assert parsed({"id": "1"}).headers == {}


# -- source and key -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "properties", "expected"),
    [
        pytest.param({"ce-source": "/ce"}, {"app_id": "app"}, "/ce", id="ce-source-beats-app-id"),
        pytest.param({"ce_source": "/ce"}, {"app_id": "app"}, "/ce", id="ce_source"),
        pytest.param(
            {"ce-source": "/dash", "ce_source": "/under"}, {}, "/dash", id="ce-source-first"
        ),
        pytest.param({}, {"app_id": "billing"}, "billing", id="app-id"),
        pytest.param({"ce-source": ""}, {"app_id": "billing"}, "billing", id="empty-ce-source"),
        pytest.param({}, {}, "", id="none"),
    ],
)
def test_source(headers: dict[str, Any], properties: dict[str, Any], expected: str) -> None:
    assert parsed({"id": "1"}, headers=headers, **properties).source == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"ce-partitionkey": "k1"}, "k1", id="ce-partitionkey"),
        pytest.param({"ce_partitionkey": "k2"}, "k2", id="ce_partitionkey"),
        pytest.param({"partition_key": "k3"}, "k3", id="partition_key"),
        pytest.param({"key": "k4"}, "k4", id="key"),
        pytest.param({"key": 17}, "17", id="numeric-key"),
        pytest.param(
            {"ce-partitionkey": "k1", "partition_key": "k3", "key": "k4"}, "k1", id="ce-first"
        ),
        pytest.param({"partition_key": "k3", "key": "k4"}, "k3", id="partition_key-before-key"),
        pytest.param({}, "", id="none"),
    ],
)
def test_key(headers: dict[str, Any], expected: str) -> None:
    assert parsed({"id": "1"}, headers=headers).key == expected


def test_key_header_beats_the_structured_partitionkey() -> None:
    envelope = parsed(
        cloudevent(partitionkey="from-event"),
        content_type=CLOUDEVENTS,
        headers={"partition_key": "from-header"},
    )

    assert envelope.key == "from-header"


# -- anomalies ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", [{"n": 1}, ["a"], True])
def test_a_cloudevent_id_that_is_not_text_gives_no_identity(bad_id: Any) -> None:
    assert parsed(cloudevent(id=bad_id), content_type=CLOUDEVENTS).message_id is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"sequence": 7}, 7, id="sequence"),
        pytest.param({"sequence": "7"}, "7", id="sequence-text"),
        pytest.param({"ce-sequence": "8"}, "8", id="ce-sequence"),
        pytest.param({"ce_sequence": "9"}, "9", id="ce_sequence"),
        pytest.param({"sequence": 1, "ce-sequence": "2"}, 1, id="sequence-first"),
        pytest.param({}, None, id="none"),
    ],
)
def test_sequence(headers: dict[str, Any], expected: Any) -> None:
    """The sequence is passed on as carried; deliver()/store() validate it."""
    assert parsed({"id": "1"}, headers=headers).sequence == expected


def test_structured_cloudevent_gives_its_sequence() -> None:
    assert parsed(cloudevent(sequence="12"), content_type=CLOUDEVENTS).sequence == "12"


# --- identities and keys that cannot be read as text -----------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"message_id": b"\xab\xcd"},  # read as the hex "abcd": another message's id
        {"message_id": {"a": 1}},
        {"message_id": [1, 2]},
        {"message_id": True},
        {"ce-id": b"\xff", "ce-source": "/orders"},
        {"ce-id": "1", "ce-source": b"\xff\xfe"},
    ],
)
def test_an_id_that_is_not_text_is_never_read_around(headers: dict[str, Any]) -> None:
    """The id is refused, never replaced by the body's ``id`` or a hex spelling."""
    envelope = parse(kombu_message({"id": "abcd", "type": "t"}, headers=headers))
    assert envelope.message_id is None
    assert envelope.problem is not None and "the message's id cannot be read" in envelope.problem


def test_a_cloudevents_source_with_a_hash_is_refused_not_merged() -> None:
    """("/orders#1", "2") and ("/orders", "1#2") both read "/orders#1#2"."""
    first = parse(kombu_message({}, headers={"ce-source": "/orders#1", "ce-id": "2"}))
    second = parse(kombu_message({}, headers={"ce-source": "/orders", "ce-id": "1#2"}))
    assert first.message_id is None and "holds '#'" in (first.problem or "")
    assert second.message_id == "/orders#1#2"


@pytest.mark.parametrize(
    "headers",
    [
        {"partition_key": [1]},
        {"key": {"a": 1}},
        {"key": True},
        {"ce-partitionkey": b"\xff\x01"},  # read as the hex "ff01": another aggregate's key
        {"event_type": ["t"]},
    ],
)
def test_a_key_or_type_that_is_not_text_keeps_the_message_dead(headers: dict[str, Any]) -> None:
    """Read as text, such a key became "" and an ordered consumer ran the version unordered."""
    envelope = parse(kombu_message({"n": 1}, headers=headers, message_id="m-1", type="t"))
    assert envelope.message_id == "m-1"
    assert envelope.problem is not None and "type or key cannot be read" in envelope.problem
    if "event_type" not in headers:  # never a hex spelling: kept dead as KeyLost, blank
        assert (envelope.key, envelope.key_lost) == ("", True)


def test_numbers_as_ids_and_keys_are_text() -> None:
    envelope = parse(kombu_message({}, headers={"message_id": 42, "key": 7}, type="t"))
    assert (envelope.message_id, envelope.key, envelope.problem) == ("42", "7", None)


def test_uuid_and_time_headers_are_kept_as_text() -> None:
    from datetime import time

    value = uuid.uuid4()
    envelope = parse(
        kombu_message({}, headers={"u": value, "t": time(12, 30)}, message_id="m", type="t")
    )
    assert envelope.headers["u"] == str(value) and envelope.headers["t"] == "12:30:00"
