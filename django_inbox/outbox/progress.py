"""What ``outbox_relay`` says while it runs, so that idle, busy and stuck look different: a line
when it starts, a line when something happened (at most one per period), and lines while it
waits for a broker it cannot reach (at once, then once a minute, and when it reaches it)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

#: Seconds between two progress lines, at least (``outbox_relay --progress-every``).
PROGRESS_EVERY = 10.0
#: Seconds between two lines while the broker cannot be reached.
WAITING_EVERY = 60.0


def masked(url: str) -> str:
    """``url`` without its password, as kombu shows it (``amqp://guest:**@host:5672//``)."""
    from kombu.connection import Connection

    try:
        return str(Connection(url).as_uri())  # type: ignore[no-untyped-call]
    except Exception:  # not a URL kombu reads: say no more than its scheme
        return url.split("://", 1)[0] + "://…"


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s" if seconds >= 1 else f"{seconds:.1f}s"


def failures(failed: Counter[str]) -> str:
    """``failed 3 (2 to retry, 1 dead)``, or ``""`` when nothing failed."""
    total = sum(failed.values())
    if not total:
        return ""
    parts = [f"{failed[status]} {said}" for status, said in _FATES if failed[status]]
    return f"failed {total} ({', '.join(parts)})"


_FATES = (("pending", "to retry"), ("dead", "dead"))


class Progress:
    """Lines for ``say`` (nothing when it is ``None``): what the relay did since the last line,
    when it did anything, at most every ``every`` seconds; the broker it waits for."""

    def __init__(self, say: Callable[[str], None] | None, broker: str, every: float) -> None:
        self.say = say
        self.broker = broker
        self.every = every
        self._at = time.monotonic()
        self._sent = 0
        self._failed: Counter[str] = Counter()
        self._waiting_since: float | None = None
        self._waiting_said = 0.0

    def tick(self, sent: int, failed: Counter[str]) -> None:
        """Say what was sent and failed since the last line, if anything was and a period
        has passed since that line."""
        now = time.monotonic()
        if self.say is None or now - self._at < self.every:
            return
        new_sent, new_failed = sent - self._sent, failed - self._failed
        if not new_sent and not new_failed:
            return
        said = ", ".join(filter(None, [f"sent {new_sent}", failures(new_failed)]))
        self.say(f"outbox_relay: {said} in the last {_duration(now - self._at)}")
        self._at, self._sent, self._failed = now, sent, Counter(failed)

    def unreachable(self, error: BaseException, pending: Callable[[], int]) -> None:
        """The broker could not be reached: say so the first time, then once a minute."""
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        elif now - self._waiting_said < WAITING_EVERY:
            return
        self._waiting_said = now
        if self.say is None:
            return
        waited = now - self._waiting_since
        since = f" for {_duration(waited)}" if waited >= 1 else ""
        self.say(
            f"outbox_relay: waiting for the broker at {self.broker}{since} ({describe(error)}); "
            f"{pending()} pending"
        )

    def reached(self) -> None:
        """The broker answered: if it was waited for, say after how long."""
        if self._waiting_since is None:
            return
        waited = time.monotonic() - self._waiting_since
        self._waiting_since = None
        if self.say is not None:
            self.say(f"outbox_relay: reached the broker at {self.broker} after {_duration(waited)}")


def describe(error: BaseException) -> str:
    """``ConnectionRefusedError: [Errno 111] Connection refused``: one line."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def start_line(relay: Any) -> str:
    """What the relay is about to do, said once on start (never a password)."""
    stops = []
    if relay.until_idle == 0:
        stops.append("until nothing is pending")
    elif relay.until_idle is not None:
        stops.append(f"until idle for {_duration(relay.until_idle)}")
    if relay.max_messages is not None:
        stops.append(f"until {relay.max_messages} sent")
    return (
        f"outbox_relay: publishing to {relay.broker} with publisher confirms, batches of "
        f"{relay.batch_size}, polling every {_duration(relay.poll_interval)}"
        + (f", {' or '.join(stops)}" if stops else "")
    )
