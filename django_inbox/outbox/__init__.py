"""The outbox companion: publish in the business transaction, relay with publisher confirms.

Add ``"django_inbox.outbox"`` to ``INSTALLED_APPS`` after ``"django_inbox"``, call
:func:`publish` where your code changes state, and run ``manage.py outbox_relay``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .publishing import publish

__all__ = ["publish"]


def __getattr__(name: str) -> Any:
    # publish() needs the app registry (its model): load it on first use.
    if name == "publish":
        from .publishing import publish

        return publish
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
