"""``inbox_replay --wait``: following a re-run in the workers, with its progress."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError

from ..services import rerun_blocked, rerun_failed, rerun_left

#: Seconds between two progress lines.
REPORT_EVERY = 2.0


def follow_rerun(
    out: Any, consumers: list[str], pks: list[int], verbosity: int, *, since: datetime
) -> None:
    """Wait until a re-run's rows (``pks``, of ``consumers``, set up at ``since``) have run,
    printing progress to ``out`` every :data:`REPORT_EVERY` seconds. Raises ``CommandError``
    (exit 1) if some ended dead or parked, or wait behind such a row."""
    started = time.monotonic()
    last_report = 0.0
    first_done: int | None = None
    total = len(pks)
    while True:
        looked = time.monotonic()
        left = rerun_left(consumers, pks=pks)
        # Rows waiting behind a dead or parked version don't move until an operator acts.
        blocked = rerun_blocked(consumers, pks=pks) if left else 0
        done = max(total - left, 0)
        now = time.monotonic()
        if first_done is None:  # what workers ran while the re-run was being set up
            first_done = done
        if verbosity >= 1 and (left == blocked or now - last_report >= REPORT_EVERY):
            elapsed = now - started
            rate = f"{(done - first_done) / elapsed:,.0f}/s" if elapsed >= 1 else "starting"
            out.write(f"re-run {done:,} / {total:,} ({rate})")
            last_report = now
        if left == blocked:
            break
        # A large re-run takes longer to count: look at most half the time.
        time.sleep(max(0.5, 2 * (time.monotonic() - looked)))
    failed = rerun_failed(consumers, since=since, pks=pks)
    if failed or blocked:
        held = f"; {blocked:,} wait behind them" if blocked else ""
        raise CommandError(
            f"{failed:,} re-run row(s) ended dead or parked{held}: replay or skip them "
            "(inbox_stats, the admin)",
            returncode=1,
        )
