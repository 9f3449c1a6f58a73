"""Parse the durations users write in settings and on the command line."""

from __future__ import annotations

import re
from datetime import timedelta

_UNITS = {
    "ms": 0.001,
    "s": 1,
    "m": 60,
    "h": 3600,
    "d": 86400,
    "w": 7 * 86400,
}
#: A bound well inside what ``datetime`` arithmetic and a wait can hold (``Event.wait`` and
#: ``time.sleep`` stop at about 292 years: a longer --poll-interval or --pause raised
#: ``OverflowError`` mid-run), and longer than any sane policy.
MAX_SECONDS = 200 * 365 * 86400
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def to_seconds(value: object) -> float:
    """Return ``value`` as seconds.

    Accepts a number of seconds, a :class:`~datetime.timedelta`, or a string such as
    ``"500ms"``, ``"30s"``, ``"5m"``, ``"2h"``, ``"30d"``, ``"1w"`` (a bare number is seconds).
    Raises :class:`ValueError` for anything else, including negative values.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _PATTERN.match(value)
        if not match:
            raise ValueError(
                f"{value!r} is not a duration; use seconds or e.g. '30s', '5m', '2h', '30d'"
            )
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"{value!r} is not a duration")
    if seconds != seconds or seconds < 0:  # NaN or negative
        raise ValueError(f"{value!r} is not a non-negative duration")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{value!r} is longer than {MAX_SECONDS // (365 * 86400):.0f} years")
    return seconds


def to_timedelta(value: object) -> timedelta:
    """Like :func:`to_seconds`, returning a :class:`~datetime.timedelta`."""
    return timedelta(seconds=to_seconds(value))
