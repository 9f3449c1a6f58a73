"""The inbox's clock: the database's, so that a lease means the same on every host.

A lease is a time (``locked_until``) that one process writes and others compare with their own
clocks. On a host whose clock runs minutes ahead, a worker would take live leases for expired
ones and run rows another worker is running; on one whose clock runs behind, its own leases
would look expired to the others; and the leases of a worker killed on a host ahead would
hold its rows for minutes after the lease should have ended.

So every time the inbox writes or compares (leases, due times, processing dates) comes from
:func:`now`: this host's clock corrected by its offset from the database's clock. Long-running
processes (``inbox_process``, ``inbox_consume``, ``outbox_relay``, ``inbox_reclaim``) measure
the offset when they start and again every :data:`REFRESH` seconds between units of work
(:func:`refresh`, from :func:`~django_inbox.db.connection.keep_connection`, and before each
claim and reclaim, so also in a web process or a Celery task that claims rows): one query,
``SELECT`` of the server's current time, bracketed by two readings of this host's clock. An
offset under :data:`TOLERANCE` is taken as none (hosts kept by NTP are within milliseconds,
and a round trip is not measured more finely than that); above it the correction applies and
a warning says by how much the host's clock is off. Dates that a process writes before it
ever claims (a web request's ``deliver()`` of a new message, an outbox row) follow its own
clock until then.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connections
from django.utils import timezone

logger = logging.getLogger("django_inbox")

#: Offsets smaller than this many seconds are taken as none.
TOLERANCE = 0.5
#: Seconds between two measurements in a long-running process.
REFRESH = 30.0

_offset = timedelta(0)
_measured_at: float | None = None


def now() -> datetime:
    """The current time on the database's clock (this host's, where no offset was measured)."""
    return timezone.now() + _offset


def offset() -> float:
    """Seconds this host's clock is behind the database's (negative: ahead), as applied."""
    return _offset.total_seconds()


def measure(using: str) -> float:
    """The database's clock minus this host's, in seconds (one round trip)."""
    connection = connections[using]
    if connection.vendor == "sqlite":
        return 0.0  # the database is a file on this host: one clock
    sql = {
        "postgresql": "SELECT clock_timestamp()",
        "mysql": "SELECT UTC_TIMESTAMP(6)",
    }.get(connection.vendor, "SELECT CURRENT_TIMESTAMP")
    before = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(sql)
        (server,) = cursor.fetchone()
    after = timezone.now()
    if isinstance(server, str):
        server = datetime.fromisoformat(server)
    if timezone.is_naive(server):
        server = timezone.make_aware(server, UTC)
    middle = before + (after - before) / 2
    return float((server - middle).total_seconds())


def synchronise(using: str) -> float:
    """Measure the offset from ``using``'s clock now and apply it; return it (seconds). Where
    it cannot be measured (``USE_TZ = False``, which makes the database's answer a naive time
    in another zone), the host's clock stays in use."""
    global _offset, _measured_at
    _measured_at = time.monotonic()
    if not settings.USE_TZ:
        return 0.0
    seconds = measure(using)
    applied = seconds if abs(seconds) >= TOLERANCE else 0.0
    if applied and abs(applied - _offset.total_seconds()) >= TOLERANCE:
        logger.warning(
            "this host's clock is %.1f s %s the database's; the inbox uses the database's "
            "clock for its leases and dates",
            abs(applied),
            "behind" if applied > 0 else "ahead of",
        )
    _offset = timedelta(seconds=applied)
    return applied


def refresh(using: str) -> None:
    """:func:`synchronise` if the last measurement is :data:`REFRESH` seconds old (or none);
    call outside a transaction. A failed measurement leaves the offset as it was."""
    if _measured_at is not None and time.monotonic() - _measured_at < REFRESH:
        return
    try:
        synchronise(using)
    except Exception:  # the database is away: the outage handling says so, not this
        logger.debug("clock offset not measured", exc_info=True)


def forget() -> None:
    """Drop the measured offset (tests, and a process that changes databases)."""
    global _offset, _measured_at
    _offset, _measured_at = timedelta(0), None
