"""The same message id delivered at the same moment from separate processes."""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter

import pytest

from django_inbox.models import InboxMessage
from tests import procs
from tests.effects import lost_and_doubled

pytestmark = [pytest.mark.server_db, pytest.mark.slow]

PROCESSES = int(os.environ.get("INBOX_TEST_PROCESSES", "8"))
ROUNDS = int(os.environ.get("INBOX_TEST_ROUNDS", "200"))


def test_concurrent_duplicates_apply_one_effect(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    workers = [
        context.Process(
            target=procs.deliver_rounds, args=(barrier, results, ROUNDS, "race", "effects")
        )
        for _ in range(PROCESSES)
    ]
    for worker in workers:
        worker.start()
    reports = [results.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    errors = [error for _, _, errs in reports for error in errs]
    assert errors == [], errors[0]
    per_round = [Counter(outcomes[n] for _, outcomes, _ in reports) for n in range(ROUNDS)]
    totals = sum(per_round, Counter())
    expected = {f"race-{n}" for n in range(ROUNDS)}
    lost, doubled = lost_and_doubled(expected)
    print(
        f"{PROCESSES} processes x {ROUNDS} rounds: outcomes={dict(totals)} "
        f"lost={lost} doubled={doubled}"
    )
    assert (lost, doubled) == (0, 0)
    assert all(r["processed"] == 1 for r in per_round), per_round
    assert set(totals) <= {"processed", "duplicate", "in_progress"}
    assert InboxMessage.objects.filter(status="completed").count() == ROUNDS


def test_parallel_workers_drain_each_message_once(manage) -> None:  # type: ignore[no-untyped-def]
    from django_inbox import store

    expected = {f"drain-{n}" for n in range(2000)}
    for message_id in sorted(expected):
        store(consumer="effects", message_id=message_id, event_type="effect.write", payload={})

    workers = [
        manage("inbox_process", "--consumer", "effects", "--batch-size", "25", "--until-idle", "1")
        for _ in range(4)
    ]
    handled = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
        handled.append(out.strip())

    lost, doubled = lost_and_doubled(expected)
    print(f"4 workers draining {len(expected)}: {handled} lost={lost} doubled={doubled}")
    assert (lost, doubled) == (0, 0)
    assert set(InboxMessage.objects.values_list("status", flat=True)) == {"completed"}
    assert set(InboxMessage.objects.values_list("attempts", flat=True)) == {1}
