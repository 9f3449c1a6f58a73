"""A model-based test of an ordered consumer under everything operators and brokers do.

Hypothesis drives one ordered consumer on the real PostgreSQL with the real worker: versions
arriving in any order, duplicates under the same and under new message ids, gaps and their
timeouts, handler failures, dead versions, operator skips, replays (past gaps too), forced
re-runs of keys from any version, purges, and transient database errors injected at any
statement inside the inbox's transactions (a real error from the server, as a deadlock or a
timeout would raise; a worker that dies of one is restarted and its leases expire).

After each step, the reference model (what the operator decided, what ran) is checked
against the tables:

- every version is applied at most once per run: at most one first run per ``(key,
  sequence)``, and re-runs only of versions that ran first;
- in order: a key's first runs ascend;
- never when skipped: no run of a version after an operator skipped it;
- after the workers drain and gaps expire, every key is caught up or shown as a problem
  (``inbox_stats``: ``dead`` or ``stalled``), and every version waiting without a deadline
  has a predecessor that can still release it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.db.models import Q
from django.test import override_settings
from django.utils import timezone
from effects.models import Effect
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from django_inbox import deliver, store
from django_inbox.models import InboxKey, InboxMessage
from django_inbox.ordered.gaps import park_expired_gaps
from django_inbox.ordered.waits import RUNNABLE
from django_inbox.processing.worker import Worker
from django_inbox.services import collect, operator, purge, reclaim, select, skipping
from tests.conftest import handler

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
Status = InboxMessage.Status

CONSUMER = "model"
KEYS = ("A", "B")
MAX_SEQUENCE = 6
POLICY = {
    "ordered": True,
    "side_effects_on_rerun": "suppress",
    "max_attempts": 3,
    "backoff_base": 0.001,
    "backoff_max": 0.001,
    "lease": 30.0,
    "gap_timeout": 600,
}
EXAMPLES = int(os.environ.get("INBOX_MODEL_EXAMPLES", "100"))
#: The same programs on every run (CI); ``INBOX_MODEL_RANDOM=1`` explores new ones.
DERANDOMIZE = not os.environ.get("INBOX_MODEL_RANDOM")


def _apply(message: InboxMessage) -> None:
    """The handler: one ``Effect`` row per committed run; fails as the payload asks."""
    payload = message.payload if isinstance(message.payload, dict) else {}
    if message.attempts <= payload.get("fail_times", 0):
        raise RuntimeError(f"planned failure on attempt {message.attempts}")
    if payload.get("reject"):
        from django_inbox import Reject

        raise Reject(payload["reject"])
    Effect.objects.create(
        consumer=CONSUMER,
        message_id=message.message_id,
        attempt=message.attempts,
        pid=int(message.sequence or 0),
        rerun=message.is_rerun,
    )


class Faults:
    """Fails the ``n``-th statement sent inside a transaction, once, with a real error from
    the server (the statement is replaced by one that divides by zero)."""

    def __init__(self) -> None:
        self.countdown: int | None = None
        self.fired = 0

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if self.countdown is not None and connection.in_atomic_block:
            self.countdown -= 1
            if self.countdown <= 0:
                self.countdown = None
                self.fired += 1
                return execute("SELECT 1 / 0", None, False, context)
        return execute(sql, params, many, context)


class OrderedModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        InboxMessage.objects.filter(consumer=CONSUMER).delete()
        InboxKey.objects.filter(consumer=CONSUMER).delete()
        Effect.objects.filter(consumer=CONSUMER).delete()
        self.copies = 0
        #: message id -> the highest Effect id when an operator skipped it.
        self.skipped_at: dict[str, int] = {}

    # --- what the world does ---------------------------------------------------------------

    @rule(
        key=st.sampled_from(KEYS),
        sequence=st.integers(1, MAX_SEQUENCE),
        copy=st.booleans(),
        how=st.sampled_from(["store", "deliver"]),
        trouble=st.sampled_from(["", "", "", "fail_once", "reject"]),
    )
    def arrive(self, key: str, sequence: int, copy: bool, how: str, trouble: str) -> None:
        """A version arrives: again under its id (a redelivery), or under a new one."""
        message_id = f"{key}-{sequence}"
        if copy:
            self.copies += 1
            message_id = f"{message_id}-c{self.copies}"
        payload: dict[str, Any] = {"n": sequence}
        if trouble == "fail_once":
            payload["fail_times"] = 1
        elif trouble == "reject":
            payload["reject"] = "the handler refuses it"
        send = deliver if how == "deliver" else store
        with self.faults_off():
            send(
                consumer=CONSUMER, message_id=message_id, event_type="model.apply",
                payload=payload, key=key, sequence=sequence,
            )  # fmt: skip

    @rule(statement=st.integers(1, 12))
    def fault(self, statement: int) -> None:
        """The next workers' run fails its ``statement``-th statement in a transaction."""
        FAULTS.countdown = statement

    @rule()
    def work(self) -> None:
        """Workers run until idle; one that dies of an error is restarted after its leases
        expire (as a supervisor and ``inbox_reclaim`` would)."""
        for _ in range(20):
            try:
                Worker([CONSUMER], until_idle=0, poll_interval=0.001).run()
                return
            except DatabaseError:
                FAULTS.countdown = None
                self._expire_leases()
        raise AssertionError("the workers never drained")

    @rule()
    def time_passes(self) -> None:
        """``gap_timeout`` passes for every waiting version with a deadline, and the lease of
        every row left ``in_progress`` (a worker that went on after an error in the inbox's own
        statement leaves its row to the lease); the sweep and ``inbox_reclaim`` run."""
        with self.faults_off():
            self._expire_leases()
        past = timezone.now() - timedelta(seconds=1)
        long_ago = timezone.now() - timedelta(hours=1)
        InboxMessage.objects.filter(
            consumer=CONSUMER, status=Status.WAITING, next_attempt_at__isnull=False
        ).update(next_attempt_at=past, updated_at=long_ago)
        try:
            park_expired_gaps(consumer=CONSUMER)
        except DatabaseError:
            FAULTS.countdown = None

    # --- what operators do -----------------------------------------------------------------

    @rule(data=st.data())
    def skip_one(self, data: st.DataObject) -> None:
        rows = list(
            InboxMessage.objects.filter(consumer=CONSUMER, status__in=skipping_statuses())
            .order_by("pk")
            .values_list("message_id", flat=True)
        )
        if not rows:
            return
        message_id = data.draw(st.sampled_from(rows))
        mark = self._last_effect()
        with self.faults_off():
            result = skipping.skip(
                select(consumer=CONSUMER, message_ids=[message_id]), actor="op", reason="bad"
            )
        if result.total:
            self.skipped_at.setdefault(message_id, mark)

    @rule()
    def replay_dead_and_parked(self) -> None:
        with self.faults_off():
            operator.replay(
                select(consumer=CONSUMER, statuses=["dead", "parked"]), actor="op", reason="go"
            )

    @rule(key=st.sampled_from(KEYS), first=st.integers(1, MAX_SEQUENCE))
    def rerun(self, key: str, first: int) -> None:
        rows = select(consumer=CONSUMER, keys=[key], statuses=["completed"]).filter(
            sequence__gte=first
        )
        with self.faults_off():
            operator.replay(rows, force=True, actor="op", reason="rebuild")

    @rule(what=st.sampled_from(["dead", "completed", "skipped"]))
    def purge_rows(self, what: str) -> None:
        with self.faults_off():
            purge(statuses=(what,), older_than=0, consumer=CONSUMER)

    # --- what must hold --------------------------------------------------------------------

    @invariant()
    def each_version_runs_once_per_run_and_in_order(self) -> None:
        firsts: dict[str, list[int]] = {}
        first_runs: set[tuple[str, int]] = set()
        for message_id, sequence, rerun in (
            Effect.objects.filter(consumer=CONSUMER).order_by("id")
            .values_list("message_id", "pid", "rerun")
        ):  # fmt: skip
            key = message_id.split("-")[0]
            if rerun:
                assert (key, sequence) in first_runs, f"{message_id} re-ran before a first run"
                continue
            assert (key, sequence) not in first_runs, f"{key} v{sequence} applied twice"
            first_runs.add((key, sequence))
            ran = firsts.setdefault(key, [])
            assert not ran or sequence > ran[-1], f"{key}: v{sequence} after v{ran[-1]}"
            ran.append(sequence)

    @invariant()
    def a_skipped_version_never_runs(self) -> None:
        for message_id, mark in self.skipped_at.items():
            ran = Effect.objects.filter(consumer=CONSUMER, message_id=message_id, id__gt=mark)
            assert not ran.exists(), f"{message_id} ran after an operator skipped it"

    @invariant()
    def a_version_waiting_without_a_deadline_has_a_predecessor(self) -> None:
        """Something will release it: the version before it, which can still run, or the end
        of the re-run under way right before it."""
        keys = {
            key: (applied, through)
            for key, applied, through in InboxKey.objects.filter(consumer=CONSUMER).values_list(
                "key", "applied_sequence", "rerun_through"
            )
        }
        for key, sequence, rerun in InboxMessage.objects.filter(
            consumer=CONSUMER, status=Status.WAITING, next_attempt_at__isnull=True
        ).values_list("key", "sequence", "rerun"):
            applied, through = keys.get(key, (0, None))
            rebuilding = through is not None and applied < through
            if rebuilding and not rerun and sequence == through + 1:
                continue  # right behind the re-run: its end releases it
            before = InboxMessage.objects.filter(
                consumer=CONSUMER, key=key, sequence=sequence - 1, status__in=RUNNABLE
            )
            assert before.exists(), f"{key} v{sequence} waits for nothing, for ever"

    def teardown(self) -> None:
        """Drained, gaps expired, drained again until nothing is due or about to be (a retry
        waits up to a millisecond): every key is caught up or a problem."""
        FAULTS.countdown = None
        moving = InboxMessage.objects.filter(consumer=CONSUMER).filter(
            Q(status__in=(Status.RECEIVED, Status.IN_PROGRESS, Status.FAILED))
            | Q(status=Status.WAITING, next_attempt_at__isnull=False)
        )
        for _ in range(20):
            self.work()
            self.time_passes()
            if not moving.exists():
                break
            time.sleep(0.005)
        left = InboxMessage.objects.filter(
            consumer=CONSUMER,
            status__in=(Status.RECEIVED, Status.IN_PROGRESS, Status.FAILED, Status.WAITING),
        )
        if left.exists():
            kinds = {problem.kind for problem in collect(consumer=CONSUMER).problems}
            held = list(left.values_list("message_id", "status", "last_error"))
            assert kinds & {"dead", "stalled"}, f"not caught up, and no problem: {held}"

    # --- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _last_effect() -> int:
        last = Effect.objects.order_by("-id").values_list("id", flat=True).first()
        return int(last or 0)

    @staticmethod
    def _expire_leases() -> None:
        expired = timezone.now() - timedelta(seconds=1)  # a lease's end is in both columns
        InboxMessage.objects.filter(consumer=CONSUMER, status=Status.IN_PROGRESS).update(
            locked_until=expired, next_attempt_at=expired
        )
        reclaim(consumer=CONSUMER)

    @contextmanager
    def faults_off(self) -> Iterator[None]:
        armed, FAULTS.countdown = FAULTS.countdown, None
        try:
            yield
        finally:
            FAULTS.countdown = armed


def skipping_statuses() -> tuple[str, ...]:
    from django_inbox.services import SKIPPABLE

    return tuple(SKIPPABLE)


FAULTS = Faults()

OrderedModel.TestCase.settings = settings(
    max_examples=EXAMPLES,
    stateful_step_count=30,
    deadline=None,
    derandomize=DERANDOMIZE,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def test_an_ordered_consumer_holds_under_every_operator_action() -> None:
    from django.conf import settings as django_settings

    consumers = {**django_settings.INBOX_CONSUMERS, CONSUMER: POLICY}
    with (
        override_settings(INBOX_CONSUMERS=consumers),
        handler("model.apply", CONSUMER, _apply),
        connection.execute_wrapper(FAULTS),
    ):
        OrderedModel.TestCase().runTest()
    assert FAULTS.fired, "no fault was ever injected: the test did not test that"
