"""A stored payload or headers as an operator reads them (the admin, ``inbox_show``): JSON text,
or, for a value this process cannot decode or write out (nested too deeply, a number of 4,300
digits or more, see :mod:`django_inbox.db.json`), the stored text and why."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..db.json import UnreadableJSON
from ..text import cut

#: Characters of a value shown as stored text when it cannot be shown as JSON of its own.
RAW_SHOWN = 20_000


@dataclass
class Shown:
    """What to show of a stored value: ``text``, and ``note`` when it is not the value's JSON
    as asked (its stored text, or its JSON unindented), saying why."""

    text: str
    note: str | None = None


def shown_json(value: Any, *, indent: int | None = None, sort_keys: bool = False) -> Shown:
    """``value`` as JSON text (indented by ``indent``, keys sorted with ``sort_keys``), or
    what is left to show of it."""
    if isinstance(value, UnreadableJSON):
        return _cut(str(value), f"Shown as stored: {value.reason}.")
    try:
        text = json.dumps(
            value, indent=indent, sort_keys=sort_keys, ensure_ascii=False, default=str
        )
        return Shown(text)
    except RecursionError:
        pass
    try:
        compact = json.dumps(value, ensure_ascii=False, default=str)
    except RecursionError:
        return Shown("", "Nested too deeply to show.")
    return _cut(compact, "Shown unindented: nested too deeply to indent.")


def _cut(text: str, note: str) -> Shown:
    if len(text) > RAW_SHOWN:
        note += f" The first {RAW_SHOWN:,} of {len(text):,} characters."
    return Shown(cut(text, RAW_SHOWN), note)
