"""Reading JSON columns so that one row can never kill the process that reads it.

Python decodes JSON recursively. A value nested deeper than the interpreter can follow (about
1,000 levels on CPython 3.11, fewer from a deep call stack, more on 3.12+) raises
``RecursionError`` wherever it is read: in a worker's claim, in the relay, in the admin. The
inbox refuses such values when they arrive (``INBOX_MAX_JSON_DEPTH``), but a row stored by an
earlier release, by another Python, or by hand can still hold one. :class:`StoredJSONField`
reads it as :class:`UnreadableJSON`, the stored text, instead of raising: the worker then
records the row ``dead`` with the reason, and the admin shows the text.
"""

from __future__ import annotations

import platform
import sys
from typing import Any

from django.db import models
from django.db.models.fields.json import KeyTransform

from ..history import readable


class UnreadableJSON(str):
    """The stored text of a JSON column that this process could not decode, and why
    (``reason``, ``detail``). Never handed to a handler (the attempt ends ``dead`` first) and
    never written back."""

    reason = "nested deeper than this Python process can decode"
    #: What the process that failed was, and where such a value comes from.
    detail = (
        f"Python {platform.python_version()}, recursion limit {sys.getrecursionlimit()}; "
        "stored before INBOX_MAX_JSON_DEPTH was checked, or not by the inbox"
    )


def too_many_digits(text: str) -> UnreadableJSON:
    found = UnreadableJSON(text)
    found.reason = "holding a number with more digits than this Python process reads"
    found.detail = (
        f"Python reads integers of at most {sys.get_int_max_str_digits()} digits; stored "
        "by hand, or by another program"
    )
    return found


def unreadable(**values: object) -> str | None:
    """Why the first of the named ``values`` that could not be decoded cannot be used
    (``the stored payload is …``), or ``None``."""
    for name, value in values.items():
        if isinstance(value, UnreadableJSON):
            return f"the stored {name} is {value.reason} ({value.detail})"
    return None


class StoredJSONField(models.JSONField):
    """A :class:`~django.db.models.JSONField` whose reads never raise ``RecursionError``.

    It stores exactly what ``JSONField`` stores and deconstructs as one, so migrations never
    see a difference.
    """

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        try:
            return super().from_db_value(value, expression, connection)
        except RecursionError:
            return UnreadableJSON(value)
        except ValueError:  # an integer of more digits than int() takes (4,300)
            return too_many_digits(value)

    def get_db_prep_value(self, value: Any, connection: Any, prepared: bool = False) -> Any:
        if isinstance(value, UnreadableJSON):
            # Saving it would store a JSON string in place of the value: refuse.
            raise ValueError(f"{self.name} could not be decoded ({value.reason}); not saved")
        return super().get_db_prep_value(value, connection, prepared)

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django.db.models.JSONField", args, kwargs


class HistoryField(StoredJSONField):
    """A row's ``history``, read as a list of entries every reader can show
    (:func:`django_inbox.history.readable`), whatever the row holds."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        decoded = super().from_db_value(value, expression, connection)
        if isinstance(expression, KeyTransform):  # history__0__kind: a part, as it is
            return decoded
        return readable(decoded)
