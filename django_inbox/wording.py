"""How the inbox words a count in what it prints and records: ``1 attempt``, ``2 attempts``,
never ``1 attempts``."""

from __future__ import annotations

#: Plurals that are not the noun with an ``s``.
IRREGULAR = {"batch": "batches", "entry": "entries"}


def plural(noun: str, n: int) -> str:
    """``noun`` as it goes with ``n``: the noun itself for 1, its plural otherwise."""
    if n == 1:
        return noun
    return IRREGULAR.get(noun, f"{noun}s")


def counted(n: int, noun: str, *, number: bool = True) -> str:
    """``n`` and ``noun`` in agreement (``1 batch``, ``1,200 batches``); with
    ``number=False`` only the noun (``consumer`` or ``consumers``)."""
    word = plural(noun, n)
    return f"{n:,} {word}" if number else word
