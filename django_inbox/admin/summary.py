"""The changelist's first screen: the problem banner and a compact count table.

Consumers with nothing to process or fix are folded into one line under the table, so that on
a service with a dozen consumers the list of messages still starts on the first screen; the
columns of ordered consumers' statuses (``waiting``, ``skipped``) appear only where a consumer
is ordered or has such rows. Parked rows and waiting versions, which are not problems but wait
for someone, are listed under the problems.
"""

from __future__ import annotations

from typing import Any

from django.urls import reverse
from django.utils.http import urlencode

from ..conf import inbox_settings
from ..db.counting import EXACT_UP_TO
from ..models import InboxMessage
from ..services import PROBLEM_KINDS, STATUSES, ConsumerStats, collect

Status = InboxMessage.Status

#: The summary estimates completed rows instead of counting them (a scan of the table) above
#: this many rows: a page view must not read the table.
SUMMARY_ESTIMATE_ABOVE = 100_000
#: Statuses only ordered consumers have.
ORDERED_STATUSES = (Status.WAITING, Status.SKIPPED)
#: Statuses that finished: a consumer with rows in these alone has nothing to show.
FINISHED = (Status.COMPLETED, Status.SKIPPED)


def _quiet(stats: ConsumerStats) -> bool:
    """Nothing to process, nothing stuck, nothing for an operator."""
    busy = any(count for status, count in stats.counts.items() if status not in FINISHED)
    return not busy and not stats.stuck


def summary() -> dict[str, Any]:
    """Counts per consumer and status with links, oldest due age, stuck/dead rows, problems,
    and the notices (parked rows, waiting versions)."""
    stats = collect(ignore=(), estimate_above=SUMMARY_ESTIMATE_ABOVE)
    base = reverse("admin:django_inbox_inboxmessage_changelist")

    def url(**query: str) -> str:
        return f"{base}?{urlencode(query)}"

    ordered = any(inbox_settings.ordered(name) for name in stats.consumers) or any(
        consumer.counts[status]
        for consumer in stats.consumers.values()
        for status in ORDERED_STATUSES
    )
    shown = [s for s in STATUSES if ordered or s not in ORDERED_STATUSES]
    rows, quiet, notices = [], [], []
    for name, consumer in sorted(stats.consumers.items()):
        parked, waiting = consumer.counts[Status.PARKED] or 0, consumer.counts[Status.WAITING] or 0
        if parked:
            gaps = f", {consumer.parked_gaps:,} of them for a gap" if consumer.parked_gaps else ""
            notices.append(
                {
                    "text": f"{name}: {parked:,} parked{gaps}, waiting for an operator",
                    "url": url(consumer=name, status__exact=Status.PARKED),
                }
            )
        if waiting:
            notices.append(
                {
                    "text": f"{name}: {waiting:,} version(s) waiting for an earlier one",
                    "url": url(consumer=name, status__exact=Status.WAITING),
                }
            )
        if _quiet(consumer):
            quiet.append({"consumer": name, "url": url(consumer=name)})
            continue
        cells = [
            {
                "status": status,
                "count": consumer.counts[status],
                "estimated": status in consumer.estimated,
                "url": url(consumer=name, status__exact=status),
            }
            for status in shown
        ]
        rows.append(
            {
                "consumer": name,
                "url": url(consumer=name),
                "cells": cells,
                "stuck": consumer.stuck,
                "oldest_pending_age": consumer.oldest_pending_age,
            }
        )
    return {
        "statuses": [(status, Status(status).label) for status in shown],
        "rows": rows,
        "quiet": quiet,
        "notices": notices,
        "problems": stats.problems,
        "problem_kinds": PROBLEM_KINDS,
        "completed_estimated": stats.completed_estimated,
        "estimated": any(consumer.estimated for consumer in stats.consumers.values()),
        "exact_up_to": EXACT_UP_TO,
        "max_pending_age": stats.max_pending_age,
        "at": stats.at,
    }
