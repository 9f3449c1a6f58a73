"""A row's life: every transition of an inbox row, named once.

Each :class:`Transition` says which statuses it may leave from, which it may reach, the
columns it writes, who makes it and where it is written (per database family where the
statement differs). The operator's actions, the claim and purge take their statuses from this
table, and ``tests/unit/test_lifecycle.py`` walks it: every transition is tried from every
status, and done exactly from the ones it names. ``docs/reference/statuses.md`` explains it.

``NEW`` stands for "no row yet" (an insert); ``DELETED`` for "no row any more" (purge).
"""

from __future__ import annotations

from dataclasses import dataclass

from .models import InboxMessage

Status = InboxMessage.Status

NEW = "(new)"
DELETED = "(deleted)"

#: What every transition out of ``in_progress`` clears: the lease (``leases.py`` writes it for
#: the ORM, ``db/statements/`` for PostgreSQL's own statements).
LEASE_CLEARED = ("locked_until", "lease_id")


@dataclass(frozen=True)
class Transition:
    name: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    writes: tuple[str, ...]
    by: str
    #: Where it is written: ``module.function`` (``families.<Family>.<method>`` for each
    #: database family's side, ``db.statements.*`` for PostgreSQL's own statements).
    where: tuple[str, ...]

    def allows(self, status: str) -> bool:
        return status in self.sources


TRANSITIONS: dict[str, Transition] = {
    t.name: t
    for t in (
        Transition(
            "insert",
            sources=(NEW,),
            targets=(
                Status.COMPLETED,
                Status.RECEIVED,
                Status.FAILED,
                Status.DEAD,
                Status.PARKED,
                Status.WAITING,
                Status.SKIPPED,
            ),
            writes=("*",),
            # A late copy of a purged message goes in parked (PostgreSQL's trigger of
            # migration 0015; elsewhere intake.late.record after db.tombstones.is_late).
            by="deliver(), store(), store_dead(), inbox_consume",
            where=(
                "db.statements.hot.insert",
                "intake.rows.insert",
                "intake.storing.store",
                "db.tombstones.is_late",
                "intake.late.record",
            ),
        ),
        Transition(
            "claim",
            sources=(Status.RECEIVED, Status.FAILED, Status.IN_PROGRESS),
            targets=(Status.IN_PROGRESS,),
            writes=("status", "attempts", "lease_id", "locked_until", "next_attempt_at"),
            by="inbox_process, deliver() of a stored row (in_progress: lease expired, taken over)",
            where=(
                "db.statements.claiming.claim_fresh",
                "db.statements.claiming.claim_message",
                "processing.claims.claim_batch",
                "families.PostgreSQL.claim_fresh",
                "families.PostgreSQL.claim_message",
            ),
        ),
        Transition(
            "complete",
            sources=(Status.IN_PROGRESS,),
            targets=(Status.COMPLETED,),
            writes=("status", "processed_at", "next_attempt_at", "last_error", *LEASE_CLEARED),
            by="the handler returned, fenced on the lease",
            where=(
                "db.statements.claiming.complete",
                "db.statements.ordered.lock_apply_complete",
                "processing.leases.complete",
                "ordered.ordering.complete",
                "families.PostgreSQL.complete_applied",
                "families.Portable.complete_applied",
            ),
        ),
        Transition(
            "fail",
            sources=(Status.IN_PROGRESS,),
            targets=(Status.FAILED, Status.DEAD, Status.PARKED),
            writes=("status", "next_attempt_at", "last_error", "history", *LEASE_CLEARED),
            by="the handler raised (Retry, Reject, Park, attempts used up: retry.used_up)",
            where=("processing.leases.fail",),
        ),
        Transition(
            "set_aside",
            sources=(Status.IN_PROGRESS,),
            targets=(Status.WAITING, Status.SKIPPED),
            writes=(
                "status",
                "attempts",
                "next_attempt_at",
                "last_error",
                "processed_at",
                *LEASE_CLEARED,
            ),
            by="a worker's decision for an ordered version: wait for its predecessor, or stale",
            where=(
                "db.statements.ordered.set_aside",
                "ordered.ordering.set_aside",
                "families.PostgreSQL.set_aside",
                "families.Portable.set_aside",
                "processing.leases.set_aside",
            ),
        ),
        Transition(
            "release_next",
            sources=(Status.WAITING,),
            targets=(Status.RECEIVED,),
            writes=("status", "next_attempt_at", "last_error"),
            by="an ordered key's version completed or was skipped: the next one is due",
            where=(
                "ordered.ordering.release_next",
                "families.Portable.release_next",
                "families.PostgreSQL.advance",
                "families.Portable.advance",
            ),
        ),
        Transition(
            "give_back",
            sources=(Status.IN_PROGRESS,),
            targets=(Status.RECEIVED, Status.FAILED),
            writes=("status", "attempts", "next_attempt_at", *LEASE_CLEARED),
            by="a graceful stop, a busy key, a lost connection: the claim's attempt taken back",
            where=(
                "processing.leases.release",
                "processing.leases.release_interrupted",
                "processing.giving_back.release",
            ),
        ),
        Transition(
            "reclaim",
            sources=(Status.IN_PROGRESS,),
            targets=(Status.FAILED, Status.DEAD, Status.RECEIVED),
            writes=(
                "status",
                "attempts",
                "next_attempt_at",
                "last_error",
                "history",
                *LEASE_CLEARED,
            ),
            by="inbox_reclaim and a claim's take-over, once the lease expired",
            where=("processing.takeover.record_abandoned_attempt", "services.reclaim.reclaim"),
        ),
        Transition(
            "park_gap",
            sources=(Status.WAITING,),
            targets=(Status.PARKED,),
            writes=("status", "next_attempt_at", "last_error", "history"),
            by="the gap sweep: an ordered version waited past gap_timeout",
            where=("ordered.gaps.park_expired_gaps",),
        ),
        Transition(
            "replay",
            sources=(Status.DEAD, Status.PARKED),
            targets=(Status.RECEIVED,),
            writes=(
                "status",
                "attempts",
                "next_attempt_at",
                "processed_at",
                "history",
                *LEASE_CLEARED,
            ),
            by="inbox_replay, the admin, services.replay()",
            where=("services.operator.replay", "families.Portable.change_appending_history"),
        ),
        Transition(
            "rerun",
            sources=(Status.COMPLETED,),
            targets=(Status.RECEIVED,),
            writes=(
                "status",
                "attempts",
                "next_attempt_at",
                "processed_at",
                "rerun",
                "history",
                *LEASE_CLEARED,
            ),
            by="inbox_replay --force where the consumer allows replaying completed rows",
            where=("services.rerun.rerun_versions", "services.operator.replay"),
        ),
        Transition(
            "park",
            sources=(Status.RECEIVED, Status.FAILED, Status.DEAD),
            targets=(Status.PARKED,),
            writes=("status", "next_attempt_at", "history"),
            by="inbox_replay's neighbour in the admin, services.park()",
            where=("services.operator.park",),
        ),
        Transition(
            "retry_now",
            sources=(Status.FAILED,),
            targets=(Status.FAILED,),
            writes=("next_attempt_at", "history"),
            by="the admin, services.retry_now()",
            where=("services.operator.retry_now",),
        ),
        Transition(
            "skip",
            sources=(Status.RECEIVED, Status.FAILED, Status.DEAD, Status.PARKED, Status.WAITING),
            targets=(Status.SKIPPED, Status.WAITING, Status.RECEIVED),
            writes=("status", "skip_requested", "next_attempt_at", "processed_at", "history"),
            by="an operator's skip of an ordered version (the key's next one: skipped now)",
            where=("services.skipping.skip",),
        ),
        Transition(
            "purge",
            sources=(Status.COMPLETED, Status.SKIPPED, Status.DEAD),
            targets=(DELETED,),
            writes=(),
            by="inbox_purge, past the retention (dead: only with a dead retention or --status)",
            where=("services.purge.purge",),
        ),
    )
}


def sources(name: str) -> tuple[str, ...]:
    """The statuses transition ``name`` may leave from."""
    return TRANSITIONS[name].sources
