"""The handler registry: filled by ``@inbox_handler`` at import, completed when the app is ready."""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from importlib import import_module
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, TypeVar

from .durations import to_seconds
from .exceptions import HandlerAlreadyRegistered

if TYPE_CHECKING:
    from .models import InboxMessage

HandlerFunc = Callable[["InboxMessage"], Any]
F = TypeVar("F", bound=HandlerFunc)


@dataclass(frozen=True)
class Handler:
    """One registered handler and its own policy overrides."""

    consumer: str
    event_type: str
    func: HandlerFunc
    max_attempts: int | None = None
    backoff_base: float | None = None
    backoff_max: float | None = None

    @property
    def name(self) -> str:
        return f"{self.func.__module__}.{self.func.__qualname__}"


class Registry:
    """Maps ``(consumer, event_type)`` to a :class:`Handler`."""

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._task_modules_loaded = False
        self._task_modules_lock = threading.Lock()
        #: ``(module path, formatted traceback)`` for handler modules that failed to import.
        self.import_errors: list[tuple[str, str]] = []

    def register(self, handler: Handler) -> None:
        key = (handler.consumer, handler.event_type)
        existing = self._handlers.get(key)
        if existing is not None and existing.name != handler.name:
            raise HandlerAlreadyRegistered(
                f"Event type {handler.event_type!r} of consumer {handler.consumer!r} already has "
                f"the handler {existing.name}; cannot register {handler.name} as well. "
                "Give the second one another consumer, or merge them."
            )
        self._handlers[key] = handler

    def unregister(self, consumer: str, event_type: str) -> None:
        self._handlers.pop((consumer, event_type), None)

    def get(self, consumer: str, event_type: str) -> Handler | None:
        found = self._handlers.get((consumer, event_type))
        if found is None:
            # Missing: perhaps an @inbox_task whose module is not imported yet (or was being
            # imported by another thread when the line above looked).
            self.load_task_modules()
            found = self._handlers.get((consumer, event_type))
        return found

    def consumers(self, *, load: bool = True) -> list[str]:
        """The consumers with handlers; ``load=False`` leaves the task modules unimported
        (system checks and pages, which every process runs)."""
        if load:
            self.load_task_modules()
        return sorted({consumer for consumer, _ in self._handlers})

    def knows(self, consumer: str) -> bool:
        """Whether ``consumer`` has at least one handler."""
        if any(c == consumer for c, _ in self._handlers):
            return True
        self.load_task_modules()
        return any(c == consumer for c, _ in self._handlers)

    def load_task_modules(self) -> bool:
        """Import the modules of ``@inbox_task`` functions (``INBOX_TASK_MODULES`` of every
        installed app), once, where Celery is installed; ``True`` if they are loaded now
        and were not when the call began (it imported them, or waited for a thread that did).

        Their handlers are needed where task rows are processed outside a Celery worker
        (``inbox_process``, a replay): so they are loaded when a handler is missing or the
        consumers are listed, never when Django starts, which every command and web process
        would pay for with Celery's import."""
        if self._task_modules_loaded:
            return False
        from django.apps import apps

        if not apps.ready:
            return False
        with self._task_modules_lock:  # another thread waits here until they are imported
            if self._task_modules_loaded:
                return True
            if find_spec("celery") is not None:
                from .conf import inbox_settings

                for module_name in inbox_settings.task_modules:
                    self.autodiscover(module_name)
            self._task_modules_loaded = True
        return True

    def event_types(self, consumer: str) -> list[str]:
        self.load_task_modules()
        return sorted(event for c, event in self._handlers if c == consumer)

    def consumers_for(self, event_type: str) -> list[str]:
        """Every consumer with a handler for ``event_type`` (for fan-out)."""
        self.load_task_modules()
        return sorted(c for c, event in self._handlers if event == event_type)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._handlers.values()))

    def __len__(self) -> int:
        return len(self._handlers)

    def autodiscover(self, module_name: str) -> None:
        """Import ``<app>.<module_name>`` for every installed app that has one.

        A module that exists but fails to import is recorded in :attr:`import_errors` (and
        reported by the ``django_inbox.E001`` system check) instead of stopping Django.
        """
        from django.apps import apps

        for app_config in apps.get_app_configs():
            path = f"{app_config.name}.{module_name}"
            try:
                if find_spec(path) is None:
                    continue
            except ImportError:
                continue
            try:
                import_module(path)
            except Exception:
                self.import_errors.append((path, traceback.format_exc(limit=5)))


registry = Registry()


def inbox_handler(
    event_type: str,
    *,
    consumer: str,
    max_attempts: int | None = None,
    backoff_base: float | str | timedelta | None = None,
    backoff_max: float | str | timedelta | None = None,
) -> Callable[[F], F]:
    """Register the decorated function as the handler of ``event_type`` for ``consumer``.

    Args:
        event_type: the message type this handler processes, e.g. ``"order.placed"``.
        consumer: the name that scopes deduplication; two consumers of one event type each
            process every message once (fan-out).
        max_attempts: attempts before the message goes ``dead``; overrides the consumer's
            policy and ``INBOX_MAX_ATTEMPTS``.
        backoff_base: ceiling of the first retry delay (seconds, ``timedelta`` or e.g.
            ``"30s"``); it doubles each attempt and the delay is drawn below it (full jitter).
        backoff_max: cap on the retry delay, in the same forms.

    The decorator only records the function: it touches no database or setting at import.
    The handler receives the :class:`~django_inbox.models.InboxMessage` and runs inside the
    transaction that marks the message completed.
    """
    if not isinstance(event_type, str) or not event_type:
        raise TypeError("inbox_handler() needs a non-empty event type string")
    if not isinstance(consumer, str) or not consumer:
        raise TypeError("inbox_handler() needs consumer=<non-empty string>")
    if max_attempts is not None and (
        isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
    ):
        raise ValueError(f"max_attempts must be a positive integer, got {max_attempts!r}")
    base = None if backoff_base is None else to_seconds(backoff_base)
    cap = None if backoff_max is None else to_seconds(backoff_max)
    if base is not None and base <= 0:
        raise ValueError(f"backoff_base must be more than zero seconds, got {backoff_base!r}")
    if base is not None and cap is not None and cap < base:
        raise ValueError(f"backoff_max ({backoff_max!r}) is shorter than backoff_base")

    def decorator(func: F) -> F:
        registry.register(
            Handler(
                consumer=consumer,
                event_type=event_type,
                func=func,
                max_attempts=max_attempts,
                backoff_base=base,
                backoff_max=cap,
            )
        )
        return func

    return decorator
