"""The inbox's operations, in one place: what management commands, Celery tasks and the admin
call, and what your own code may call. Each function works on the inbox database
(``INBOX_DATABASE``) and is safe to run from several processes at once: rows are claimed or
locked with ``SKIP LOCKED`` and changed with conditional updates, so two runs never process,
reclaim, replay or delete a row twice.

- :mod:`~django_inbox.services.process`: ``process_due()``, the worker and the broker consumer;
- :mod:`~django_inbox.services.reclaim`: rows whose worker died;
- :mod:`~django_inbox.services.purge`: deleting rows past their retention;
- :mod:`~django_inbox.services.selection`: finding and counting rows for an operator;
- :mod:`~django_inbox.services.operator`: replaying, parking, retrying now (what they share:
  :mod:`~django_inbox.services.actions`; an ordered consumer's re-run:
  :mod:`~django_inbox.services.rerun`; skipping: :mod:`~django_inbox.services.skipping`);
- :mod:`~django_inbox.services.showing`: a stored value as an operator reads it;
- :mod:`~django_inbox.services.stats`: counts and known consumers;
  :mod:`~django_inbox.services.problems`: the problems they show;
- :mod:`~django_inbox.services.groups`: failure groups, the problem rows by cause.
"""

from __future__ import annotations

from .actions import ActionResult
from .groups import GROUPED, FailureGroup, failure_groups, group_pks
from .operator import PARKABLE, REPLAYABLE, RETRYABLE, SKIPPABLE, park, replay, retry_now
from .process import (
    AckMode,
    BrokerConsumer,
    BrokerMisconfigured,
    BrokerUnreachable,
    ConsumeStats,
    DatabaseMisconfigured,
    Worker,
    WorkerStats,
    give_back_interrupted,
    process_due,
)
from .purge import PURGEABLE, PurgeProgress, PurgeResult, expired, purge
from .reclaim import ReclaimResult, reclaim, reclaimable
from .rerun import rerun_blocked, rerun_failed, rerun_left
from .selection import (
    by_message_id,
    command_actor,
    consumers_of,
    count_by_status,
    find,
    select,
    tally_by_status,
)
from .showing import Shown, shown_json
from .skipping import skip
from .stats import (
    PROBLEM_KINDS,
    STATUSES,
    ConsumerStats,
    InboxStats,
    Problem,
    collect,
    known_consumers,
)

__all__ = [
    "GROUPED",
    "PARKABLE",
    "PROBLEM_KINDS",
    "PURGEABLE",
    "REPLAYABLE",
    "RETRYABLE",
    "SKIPPABLE",
    "STATUSES",
    "AckMode",
    "ActionResult",
    "BrokerConsumer",
    "BrokerMisconfigured",
    "BrokerUnreachable",
    "ConsumeStats",
    "ConsumerStats",
    "DatabaseMisconfigured",
    "FailureGroup",
    "InboxStats",
    "Problem",
    "PurgeProgress",
    "PurgeResult",
    "ReclaimResult",
    "Shown",
    "Worker",
    "WorkerStats",
    "by_message_id",
    "collect",
    "command_actor",
    "consumers_of",
    "count_by_status",
    "expired",
    "failure_groups",
    "find",
    "give_back_interrupted",
    "group_pks",
    "known_consumers",
    "park",
    "process_due",
    "purge",
    "reclaim",
    "reclaimable",
    "replay",
    "rerun_blocked",
    "rerun_failed",
    "rerun_left",
    "retry_now",
    "select",
    "shown_json",
    "skip",
    "tally_by_status",
]
