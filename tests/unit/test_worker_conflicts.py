"""A deadlock or a lock timeout in a worker's own statements (its claim, a shared batch's
commit) is no one's failure: the worker gives back what it held, waits a moment and goes on.
It used to end the worker: at ``REPEATABLE READ`` on MariaDB a claim's deadlock made a worker
of an ordered consumer exit. The errors are the database's own (``psycopg``'s and
``mysqlclient``'s, as Django raises them), injected where they happened."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection, utils
from effects.models import Effect

from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.processing import worker as worker_module
from django_inbox.processing.worker import Worker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no deadlocks"),
]
Status = InboxMessage.Status


def deadlock() -> Exception:
    """A deadlock as the test database reports it, wrapped by Django."""
    try:
        try:
            if connection.vendor == "mysql":
                import MySQLdb

                raise MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock")
            from psycopg import errors

            raise errors.DeadlockDetected("deadlock detected")
        except Exception as driver:
            raise utils.OperationalError(*driver.args) from driver
    except utils.OperationalError as exc:
        return exc


def once(real: Any, calls: list[int]) -> Any:
    def flaky(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise deadlock()
        return real(*args, **kwargs)

    return flaky


def stored(*message_ids: str) -> None:
    for message_id in message_ids:
        assert store(
            consumer="effects", message_id=message_id, event_type="effect.write", payload={}
        )


def test_a_deadlock_in_the_claim_is_tried_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="django_inbox")
    stored("d-1")
    calls: list[int] = []
    monkeypatch.setattr(worker_module, "claim_batch", once(worker_module.claim_batch, calls))

    stats = Worker(consumers=["effects"], until_idle=0.5, poll_interval=0.01).run()

    assert stats.outcomes["processed"] == 1 and len(calls) >= 2
    row = InboxMessage.objects.get(message_id="d-1")
    assert (row.status, row.attempts) == (Status.COMPLETED, 1)
    assert Effect.objects.filter(message_id="d-1").count() == 1
    assert "trying again" in caplog.text


def test_a_deadlock_in_a_shared_batch_gives_its_rows_back_uncounted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored("s-1", "s-2")
    calls: list[int] = []
    monkeypatch.setattr(worker_module, "process_batch", once(worker_module.process_batch, calls))

    stats = Worker(consumers=["effects"], until_idle=0.5, poll_interval=0.01, commit_every=2).run()

    assert stats.outcomes["processed"] == 2
    for row in InboxMessage.objects.filter(message_id__in=["s-1", "s-2"]):
        # Given back uncounted; a shared batch blames none of its rows (as when its worker dies).
        assert (row.status, row.attempts, row.history) == (Status.COMPLETED, 1, [])
    assert Effect.objects.filter(message_id__in=["s-1", "s-2"]).count() == 2
