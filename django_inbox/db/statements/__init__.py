"""Every hand-written SQL statement of the inbox, each behind a named function.

The rest of the package goes through the ORM. These statements are written by hand because
each saves a round trip on a hot path (the insert that deduplicates, the claim, the fenced
completion, the duplicate's status, an ordered consumer's key lock and completion) or does
what the ORM cannot say (a history entry appended in SQL, a delete of a locked batch, a loose
index scan, the planner's row estimate). This package is the only place in the inbox that
calls ``cursor.execute``: :mod:`.hot` and :mod:`.claiming` for the hot path, :mod:`.ordered`
and :mod:`.keys` (a key's own row) for ordered consumers, :mod:`.upkeep` for operators and
upkeep. A reviewer reads here every
statement the inbox sends (the optional outbox app keeps its few in its ``publishing``,
``rows`` and ``services`` modules).

Statuses that a statement compares with are written into its text as literals, never bound as
parameters: under server-side prepared statements a parameterised ``status IN (%s, %s)`` gets
a generic plan that cannot use the partial indexes (a claim took 165 ms at 1M rows instead of
0.02 ms).
"""

from __future__ import annotations

from .claiming import claim_fresh, claim_fresh_sql, claim_message, complete
from .common import IdentityIndexChanged, NewRow
from .hot import current_status, current_status_sql, insert, insert_completed, insert_or_status
from .keys import KeyState, lock_and_apply, lock_key
from .ordered import Taken, advance, complete_ordered, lock_apply_complete, set_aside
from .upkeep import (
    delete_selected,
    distinct_consumers,
    estimated_rows,
    server_encoding,
    update_appending_history,
)

__all__ = [
    "IdentityIndexChanged",
    "KeyState",
    "NewRow",
    "Taken",
    "advance",
    "claim_fresh",
    "claim_fresh_sql",
    "claim_message",
    "complete",
    "complete_ordered",
    "current_status",
    "current_status_sql",
    "delete_selected",
    "distinct_consumers",
    "estimated_rows",
    "insert",
    "insert_completed",
    "insert_or_status",
    "lock_and_apply",
    "lock_apply_complete",
    "lock_key",
    "server_encoding",
    "set_aside",
    "update_appending_history",
]
