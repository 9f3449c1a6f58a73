"""What each of the admin's actions on inbox messages is: the service it calls, the statuses it
changes, its permission, and what its confirmation page and its report say. The machinery that
confirms, runs and audits them is :mod:`django_inbox.admin.actions`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import services
from ..models import InboxMessage
from ..services import ActionResult
from ..wording import counted

Status = InboxMessage.Status


@dataclass(frozen=True)
class Action:
    """One admin action: what it calls, from which statuses, and what its pages say."""

    permission: str
    description: str
    title: str
    button: str
    verb: str
    explain: str
    #: The statuses it changes rows from.
    start: tuple[str, ...]
    run: Callable[..., ActionResult]
    options: dict[str, Any] = field(default_factory=dict)
    reason_required: bool = False
    #: Rows in other statuses are counted as refused without being passed to ``run``.
    only_from: bool = False
    #: What the report calls a row, counted (``None``: ``message(s)``, as it always said).
    noun: str | None = None
    #: Said after the report of a run that changed rows.
    done: str = ""

    def counted(self, n: int) -> str:
        return f"{n:,} message(s)" if self.noun is None else counted(n, self.noun)

    def __getitem__(self, name: str) -> Any:  # the confirmation template reads spec.<name>
        return {"from": self.start}.get(name, getattr(self, name, None))


ACTIONS: dict[str, Action] = {
    "replay_messages": Action(
        permission="replay",
        description="Replay dead or parked messages",
        title="Replay dead or parked messages",
        button="Replay this message",
        verb="Replayed",
        start=services.REPLAYABLE,
        run=services.replay,
        explain="They go back to received, due now, with a fresh set of attempts; their "
        "history is kept. Completed messages are not re-run by this action.",
    ),
    "force_rerun_messages": Action(
        permission="force_replay",
        description="Re-run completed messages (force)",
        title="Re-run completed messages",
        button="Re-run this message",
        verb="Re-ran",
        start=(Status.COMPLETED,),
        run=services.replay,
        options={"force": True},
        only_from=True,
        reason_required=True,
        explain="Their handlers run again, as re-runs (message.is_rerun), and the effects they "
        "write are applied a second time; calls to @side_effect functions run or are "
        "suppressed as each consumer's policy says (below). An ordered consumer's keys re-run "
        "in sequence order from the first selected version, later versions included. Only do "
        "this to repair data the first run got wrong, or to rebuild. A reason is required.",
    ),
    "park_messages": Action(
        permission="park",
        description="Park messages",
        title="Park messages",
        button="Park this message",
        verb="Parked",
        start=services.PARKABLE,
        run=services.park,
        explain="No worker takes a parked message until it is replayed.",
    ),
    "retry_messages_now": Action(
        permission="retry",
        description="Retry failed messages now",
        title="Retry failed messages now",
        button="Retry this message now",
        verb="Made due now",
        start=services.RETRYABLE,
        run=services.retry_now,
        explain="The next attempt runs as soon as a worker polls, instead of after its "
        "backoff. Attempts already made still count.",
    ),
    "skip_versions": Action(
        permission="skip",
        description="Skip these versions (ordered consumers)",
        title="Skip versions of ordered consumers",
        button="Skip this version",
        verb="Skipped",
        start=services.SKIPPABLE,
        run=services.skip,
        reason_required=True,
        explain="They will never run: each becomes skipped. Where one is the next version of "
        "its key, the key counts it as applied and its following version runs. Only "
        "messages with a key and a sequence in an ordered consumer can be skipped. A reason "
        "is required.",
    ),
}
