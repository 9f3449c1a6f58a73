"""Graceful stop for long-running commands: the first SIGTERM/SIGINT asks, the second insists."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SecondSignal(SystemExit):
    """Raised by the second signal: in-flight work rolls back, the process exits 1."""

    def __init__(self) -> None:
        super().__init__(1)


class Shutdown:
    """Tracks stop requests. ``wait(seconds)`` sleeps but wakes at once on a stop request."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signals = 0

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self) -> None:
        self._event.set()

    def wait(self, seconds: float) -> bool:
        return self._event.wait(seconds)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals > 1:
            raise SecondSignal()
        self.request()

    @contextmanager
    def handling_signals(self) -> Iterator[Shutdown]:
        """Install the handlers (main thread only) and restore the previous ones on exit."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous: dict[signal.Signals, Any] = {sig: signal.getsignal(sig) for sig in SIGNALS}
        for sig in SIGNALS:
            signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
