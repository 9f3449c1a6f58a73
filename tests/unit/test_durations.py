"""``django_inbox.durations``: the durations users write in settings and on the command line."""

from __future__ import annotations

from datetime import timedelta

import pytest

from django_inbox.durations import to_seconds, to_timedelta


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (5, 5.0),
        (2.5, 2.5),
        ("0", 0.0),
        ("45", 45.0),
        ("1.5", 1.5),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("30d", 2_592_000.0),
        ("1w", 604_800.0),
        ("1.5h", 5400.0),
        (" 10 s ", 10.0),
        (timedelta(minutes=2), 120.0),
        (timedelta(milliseconds=250), 0.25),
        (timedelta(0), 0.0),
    ],
)
def test_to_seconds_accepts(value: object, seconds: float) -> None:
    result = to_seconds(value)
    assert result == pytest.approx(seconds)
    assert isinstance(result, float)


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "soon",
        "5 minutes",
        "5min",
        "5M",
        "1e3",
        ".5s",
        "5m30s",
        "inf",
        "nan",
        "-5",
        "-5s",
        "5y",
        "ms",
    ],
)
def test_to_seconds_refuses_bad_strings(value: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        to_seconds(value)


@pytest.mark.parametrize("value", [-1, -0.001, timedelta(seconds=-1), float("nan")])
def test_to_seconds_refuses_negative_and_nan(value: object) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        to_seconds(value)


@pytest.mark.parametrize("value", [True, False])
def test_to_seconds_refuses_bools(value: bool) -> None:
    # ``True`` is an int in Python; as a duration it is almost surely a mistake.
    with pytest.raises(ValueError, match="not a duration"):
        to_seconds(value)


@pytest.mark.parametrize("value", [None, [5], {"s": 5}, b"5s", object()])
def test_to_seconds_refuses_other_types(value: object) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        to_seconds(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (90, timedelta(seconds=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("5m", timedelta(minutes=5)),
        ("2h", timedelta(hours=2)),
        ("30d", timedelta(days=30)),
        ("1w", timedelta(weeks=1)),
        (timedelta(hours=3), timedelta(hours=3)),
    ],
)
def test_to_timedelta(value: object, expected: timedelta) -> None:
    assert to_timedelta(value) == expected


@pytest.mark.parametrize("value", ["", "soon", -1, float("nan"), True, None])
def test_to_timedelta_refuses_what_to_seconds_refuses(value: object) -> None:
    with pytest.raises(ValueError):
        to_timedelta(value)


@pytest.mark.parametrize("value", [float("inf"), 1e300, "99999999999999w"])
def test_to_timedelta_out_of_range_is_a_value_error(value: object) -> None:
    with pytest.raises(ValueError):
        to_timedelta(value)


def test_every_duration_taken_can_be_waited_for() -> None:
    """``--poll-interval 300000d`` passed (1000 years were taken) and the first wait raised
    ``OverflowError``: every duration the inbox takes is one a process can wait."""
    import threading

    from django_inbox.durations import MAX_SECONDS

    free = threading.Lock()  # free: acquired at once, once the timeout is found waitable
    assert free.acquire(timeout=to_seconds(f"{MAX_SECONDS}s"))
    with pytest.raises(OverflowError):
        threading.Lock().acquire(timeout=1000 * 365 * 86400.0)  # what was taken before
    with pytest.raises(ValueError, match="longer than 200 years"):
        to_seconds("300000d")
