"""The transitions whose SQL differs between database families, side by side.

:class:`Portable` does each of them through Django's ORM, on every database Django supports
(SQLite, MariaDB and MySQL). :class:`PostgreSQL` overrides the ones it does in fewer round
trips with its own statements (``db/statements/``: ``FOR UPDATE SKIP LOCKED`` claims, a
key's lock, apply and completion in one statement, history appended in SQL). The callers
(``processing/claims.py``, ``ordered/ordering.py``, the operator's services) ask
:func:`family` and never test the vendor themselves, so a database family that needs its
own SQL (MariaDB) is one more subclass here. ``lifecycle.TRANSITIONS`` names both sides.
"""

from __future__ import annotations

from django.db import connections

from ..conf import inbox_settings
from .portable import Changes as Changes
from .portable import Portable as Portable
from .postgresql import PostgreSQL as PostgreSQL

_FAMILIES: dict[str, Portable] = {"postgresql": PostgreSQL()}
_PORTABLE = Portable()


def family(using: str | None = None) -> Portable:
    """The transitions of the database ``using`` (the inbox's by default)."""
    return _FAMILIES.get(connections[using or inbox_settings.database].vendor, _PORTABLE)
