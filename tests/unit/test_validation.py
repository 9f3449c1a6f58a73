"""``django_inbox.intake.validation``: bad input is refused before anything is stored."""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_inbox import exceptions
from django_inbox.exceptions import (
    InvalidField,
    InvalidMessage,
    InvalidMessageId,
    InvalidPayload,
    PayloadTooLarge,
    UnknownEventType,
)
from django_inbox.intake.validation import (
    MESSAGE_ID_MAX,
    clean_message_id,
    clean_text,
    encode_json,
    max_json_depth,
    nesting_exceeds,
)
from tests.databases import on_mariadb

# --- clean_message_id ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", ["evt-123", "a", "x" * 255, " padded ", "ünïcödé-✓", "a\nb", "😀" * 255]
)
def test_message_id_accepted_unchanged(value: str) -> None:
    assert clean_message_id(value) == value


def test_message_id_limit_is_255() -> None:
    assert MESSAGE_ID_MAX == 255


def test_int_message_id_becomes_text() -> None:
    assert clean_message_id(42) == "42"
    assert clean_message_id(0) == "0"
    assert clean_message_id(-7) == "-7"
    assert clean_message_id(10**30) == "1" + "0" * 30


def test_uuid_message_id_becomes_canonical_text() -> None:
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert clean_message_id(value) == "12345678-1234-5678-1234-567812345678"


@pytest.mark.parametrize("value", ["", " ", "\t\n  "])
def test_empty_message_id_refused(value: str) -> None:
    with pytest.raises(InvalidMessageId, match="empty"):
        clean_message_id(value)


@pytest.mark.parametrize("value", ["x" * 256, "😀" * 256, "y" * 10_000])
def test_overlong_message_id_refused(value: str) -> None:
    with pytest.raises(InvalidMessageId, match="255"):
        clean_message_id(value)


@pytest.mark.parametrize("value", ["a\x00b", "\x00", "evt-1\x00"])
def test_nul_in_message_id_refused(value: str) -> None:
    with pytest.raises(InvalidMessageId, match="NUL"):
        clean_message_id(value)


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        (None, "NoneType"),
        (True, "bool"),
        (False, "bool"),
        (1.5, "float"),
        (b"evt-1", "bytes"),
        (["evt-1"], "list"),
        ({"id": 1}, "dict"),
        (Decimal("1"), "Decimal"),
    ],
)
def test_other_message_id_types_refused(value: object, type_name: str) -> None:
    with pytest.raises(InvalidMessageId, match=f"must be a string, got {type_name}"):
        clean_message_id(value)


# --- clean_text ------------------------------------------------------------------------------


def test_clean_text_required_and_optional() -> None:
    assert clean_text("consumer", "inventory", required=True) == "inventory"
    assert clean_text("source", None, required=False) == ""
    assert clean_text("source", "", required=False) == ""
    with pytest.raises(InvalidField, match="consumer is empty"):
        clean_text("consumer", "  ", required=True)
    with pytest.raises(InvalidField, match="consumer must be a string"):
        clean_text("consumer", None, required=True)
    with pytest.raises(InvalidField, match="key must be a string, got int"):
        clean_text("key", 5, required=False)


def test_clean_text_limits() -> None:
    assert clean_text("consumer", "c" * 100, required=True, max_length=100) == "c" * 100
    with pytest.raises(InvalidField, match="101 characters"):
        clean_text("consumer", "c" * 101, required=True, max_length=100)
    with pytest.raises(InvalidField, match="256 characters"):
        clean_text("event_type", "e" * 256, required=True)
    with pytest.raises(InvalidField, match="NUL"):
        clean_text("event_type", "order\x00placed", required=True)


# --- encode_json -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        {"sku": "A1", "qty": 5},
        [1, 2.5, None, True, "x"],
        "text",
        0,
        None,
        {"nested": {"list": [{"a": []}]}},
        {"unicode": "ünïcödé ✓ 😀"},
        {"big": 2**70},
    ],
)
def test_encode_json_round_trips(value: object) -> None:
    text = encode_json("payload", value)
    assert isinstance(text, str)
    assert json.loads(text) == value


def test_encode_json_is_compact_and_keeps_unicode() -> None:
    assert encode_json("payload", {"a": [1, 2], "b": "é"}) == '{"a":[1,2],"b":"é"}'


def test_encode_json_tuples_become_lists() -> None:
    assert encode_json("payload", {"t": (1, 2)}) == '{"t":[1,2]}'


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        float("-inf"),
        {"price": float("nan")},
        {"limit": float("inf")},
        [1, float("-inf")],
    ],
)
def test_nan_and_infinity_refused(value: object) -> None:
    with pytest.raises(InvalidPayload, match="payload is not valid JSON"):
        encode_json("payload", value)


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {1, 2},
        {"when": uuid.uuid4()},
        {"amount": Decimal("1.10")},
        {"raw": b"bytes"},
        {(1, 2): "tuple key"},
    ],
)
def test_non_serialisable_refused(value: object) -> None:
    with pytest.raises(InvalidPayload, match="payload is not JSON-serialisable"):
        encode_json("payload", value)


def test_circular_structure_refused() -> None:
    value: list[object] = []
    value.append(value)
    with pytest.raises(InvalidPayload):
        encode_json("payload", value)


@pytest.fixture
def depth_limit(django_db_blocker: Any) -> tuple[int, str]:
    """The deepest nesting the test database may store and what sets it: the setting's 64,
    or 31 on MariaDB, whose JSON columns refuse deeper values (``json_valid``)."""
    with django_db_blocker.unblock():  # MariaDB or MySQL: the server's version tells
        return max_json_depth()


def test_deeply_nested_structure_refused(depth_limit: tuple[int, str]) -> None:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    limit, said = depth_limit
    with pytest.raises(InvalidPayload, match=f"{re.escape(said)} {limit} "):
        encode_json("payload", value)


def test_the_limit_is_the_settings_where_the_database_stores_it(
    depth_limit: tuple[int, str],
) -> None:
    if on_mariadb():
        assert depth_limit == (31, "MariaDB's JSON columns (json_valid) allow")
    else:
        assert depth_limit == (64, "INBOX_MAX_JSON_DEPTH allows")


def nested(depth: int) -> object:
    """A value ``depth`` levels deep: lists and objects in turn around a number."""
    value: object = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def at(depth: int | str, limit: int) -> int:
    """A depth given as a number, or relative to the limit: ``"limit"``, ``"limit - 1"``…"""
    if isinstance(depth, int):
        return depth
    return limit + int(depth.removeprefix("limit").replace(" ", "") or 0)


@pytest.mark.parametrize("depth", [1, 2, "limit - 1", "limit"])
def test_nesting_up_to_the_limit_accepted(depth: int | str, depth_limit: tuple[int, str]) -> None:
    levels = at(depth, depth_limit[0])
    assert json.loads(encode_json("payload", nested(levels))) == nested(levels)


@pytest.mark.parametrize("depth", ["limit + 1", 100, 960, 995, 5000])
def test_nesting_past_the_limit_refused(depth: int | str, depth_limit: tuple[int, str]) -> None:
    limit = depth_limit[0]
    with pytest.raises(InvalidPayload, match=f"nested more than {limit} levels deep"):
        encode_json("payload", nested(at(depth, limit)))


def test_depth_limit_is_the_setting(settings: Any) -> None:
    settings.INBOX_MAX_JSON_DEPTH = 3
    encode_json("payload", nested(3))
    with pytest.raises(InvalidPayload, match="INBOX_MAX_JSON_DEPTH allows 3"):
        encode_json("payload", nested(4))


def test_brackets_inside_strings_do_not_nest() -> None:
    text = "[{" * 500 + '\\"]}' + "\\" + '"'
    value = {"a": [text, {"b": text}], "c": ["]" * 200, "{" * 200]}
    assert json.loads(encode_json("payload", value)) == value
    assert not nesting_exceeds(json.dumps(value), 3)


def test_many_shallow_brackets_are_not_deep() -> None:
    value = [{"a": [1]} for _ in range(10_000)]
    assert not nesting_exceeds(json.dumps(value), 3)
    assert nesting_exceeds(json.dumps(value), 2)


@pytest.mark.parametrize("value", ["\ud800", {"k": "a\udfffb"}, {"\udc80": 1}])
def test_lone_surrogate_refused(value: object) -> None:
    with pytest.raises(InvalidPayload, match="surrogate"):
        encode_json("payload", value)


def test_valid_surrogate_pair_as_emoji_accepted() -> None:
    assert json.loads(encode_json("payload", {"e": "😀"})) == {"e": "😀"}


@pytest.mark.parametrize(
    "value",
    [
        "\x00",
        {"text": "a\x00b"},
        {"a\x00": 1},
        ["ok", ["deep", "x\x00"]],
        {"text": "\\\x00"},  # a backslash followed by a real NUL
        {"text": "\\\\\x00"},  # two backslashes followed by a real NUL
    ],
)
def test_nul_character_refused(value: object) -> None:
    with pytest.raises(InvalidPayload, match="NUL"):
        encode_json("payload", value)


@pytest.mark.parametrize(
    "value",
    [
        {"text": "\\u0000"},  # backslash, then the five characters u0000
        {"text": "C:\\u0000\\dir"},
        {"\\u0000": "key"},
        "\\\\u0000",  # two backslashes, then u0000
        "u0000",
    ],
)
def test_literal_backslash_u0000_text_accepted(value: object) -> None:
    text = encode_json("payload", value)
    assert json.loads(text) == value


def test_size_limit_counts_utf8_bytes() -> None:
    # '"é"' is 4 bytes in UTF-8 but 3 characters.
    assert encode_json("payload", "é", max_bytes=4) == '"é"'
    with pytest.raises(PayloadTooLarge, match="payload is 4 bytes"):
        encode_json("payload", "é", max_bytes=3)


def test_size_limit_is_inclusive() -> None:
    value = {"a": "x" * 10}
    size = len(json.dumps(value, separators=(",", ":")).encode())
    assert encode_json("payload", value, max_bytes=size)
    with pytest.raises(PayloadTooLarge, match=f"allows {size - 1}"):
        encode_json("payload", value, max_bytes=size - 1)


def test_no_limit_without_max_bytes() -> None:
    assert len(encode_json("payload", "x" * 2_000_000)) == 2_000_002


def test_error_names_the_field() -> None:
    with pytest.raises(InvalidPayload, match=r"^headers "):
        encode_json("headers", {"x": float("nan")})


@pytest.mark.parametrize(
    "exc",
    [
        InvalidMessage,
        InvalidMessageId,
        InvalidField,
        InvalidPayload,
        PayloadTooLarge,
        UnknownEventType,
    ],
)
def test_all_input_errors_are_value_errors(exc: type[Exception]) -> None:
    assert issubclass(exc, ValueError)
    assert issubclass(exc, InvalidMessage)


def test_payload_too_large_is_an_invalid_payload() -> None:
    assert issubclass(PayloadTooLarge, InvalidPayload)
    assert exceptions.PayloadTooLarge is PayloadTooLarge


def test_lone_surrogate_in_message_id_refused() -> None:
    with pytest.raises(InvalidMessageId):
        clean_message_id("evt-\ud800")


def depth_of(value: object) -> int:
    """The reference: nesting of arrays and objects, walked on the decoded value."""
    if isinstance(value, list):
        return 1 + max((depth_of(item) for item in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(item) for item in value.values()), default=0)
    return 0


_TRICKY_TEXT = st.text(alphabet='[]{}"\\\\ aé\\u2028', max_size=8)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | _TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY_TEXT, inner, max_size=4),
    max_leaves=60,
)


@settings(max_examples=400, deadline=None)
@given(value=_JSON_VALUES, limit=st.integers(min_value=1, max_value=8), ascii_only=st.booleans())
def test_nesting_check_agrees_with_the_decoded_value(
    value: object, limit: int, ascii_only: bool
) -> None:
    """Brackets and quotes inside strings, escapes, non-ASCII text: the text check says what a
    walk of the value says."""
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert nesting_exceeds(text, limit) is (depth_of(value) > limit)


@pytest.mark.parametrize("depth", [63, 64, 65, 129])
def test_nesting_of_objects_and_arrays_in_turn_is_counted_level_by_level(depth: int) -> None:
    """``{"k": [{"k": [...]}]}``: each pass takes one level off, never an array and the object
    around it together."""
    assert nesting_exceeds(json.dumps(nested(depth)), 64) is (depth > 64)


def random_tree(rng: Any, height: int, budget: list[int]) -> object:
    """Arrays and objects of random width down to ``height`` (one branch reaches it), strings
    with brackets between; ``budget`` bounds the containers made."""
    if height == 0:
        return rng.choice([1, "]}[", '"{', None])
    budget[0] -= 1
    width = rng.randrange(3) if budget[0] > 0 else 0
    children = [random_tree(rng, rng.randrange(height), budget) for _ in range(width)]
    children.append(random_tree(rng, height - 1, budget))
    rng.shuffle(children)
    if rng.random() < 0.5:
        return children
    return {f"k{i}]": child for i, child in enumerate(children)}


@pytest.mark.parametrize("seed", range(40))
def test_nesting_past_the_levels_peeled_first_is_walked_right(seed: int) -> None:
    """Deeper than the levels taken off pair by pair (8), the rest is counted by a walk over
    runs of brackets: checked against the decoded value at limits on both sides."""
    import random

    rng = random.Random(seed)
    value = random_tree(rng, rng.randrange(9, 90), [400])
    text = json.dumps(value, ensure_ascii=bool(seed % 2))
    depth = depth_of(value)
    for limit in {9, 16, depth - 1, depth, depth + 1, 64}:
        if limit >= 1:
            assert nesting_exceeds(text, limit) is (depth > limit), (seed, depth, limit)
