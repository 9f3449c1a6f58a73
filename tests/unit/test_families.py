"""``django_inbox.families``: each transition whose SQL differs between database families,
side by side. The portable family (the ORM, what SQLite, MariaDB and MySQL run) is proven here
on PostgreSQL as well, under the same concurrency the PostgreSQL family meets: the ordering
tests (those that test no PostgreSQL statement) and the ordered model's programs (arrivals in
any order, redeliveries, failures, skips, replays, re-runs, purges, server errors, worker
restarts) hold with it, and an operator's action leaves the same rows and history whichever
family writes them. (The model alone did not catch a portable release that released nothing:
its drain ends every key caught up through the workers' re-arming of orphans; the ordering
tests do.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from hypothesis import settings

from django_inbox import families, store
from django_inbox.families import Portable, PostgreSQL, family
from django_inbox.models import InboxMessage
from django_inbox.services import park, replay, select

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status


@pytest.fixture
def portable(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every database runs the portable family (PostgreSQL's own statements unused)."""
    monkeypatch.setattr(families, "_FAMILIES", {})
    yield


def test_each_database_gets_its_family() -> None:
    expected = PostgreSQL if connection.vendor == "postgresql" else Portable
    assert type(family()) is expected


@pytest.mark.postgres
def test_the_portable_family_holds_the_ordered_model_on_postgresql(portable: None) -> None:
    from tests.unit import test_ordered_model as model

    assert type(family()) is Portable
    kept = model.OrderedModel.TestCase.settings
    model.OrderedModel.TestCase.settings = settings(kept, max_examples=min(40, model.EXAMPLES))
    try:
        model.test_an_ordered_consumer_holds_under_every_operator_action()
    finally:
        model.OrderedModel.TestCase.settings = kept


def _after_actions() -> list[tuple[Any, ...]]:
    for i, status in enumerate((Status.DEAD, Status.PARKED, Status.FAILED, Status.RECEIVED)):
        store(consumer="effects", message_id=f"f-{i}", event_type="effect.write", payload={})
        InboxMessage.objects.filter(message_id=f"f-{i}").update(status=status, attempts=i)
    actor = {"actor": "families", "reason": "side by side"}
    replay(select(consumer="effects", statuses=["dead", "parked"]), **actor)
    park(select(consumer="effects", message_ids=["f-2", "f-3"]), **actor)
    rows = InboxMessage.objects.order_by("message_id")
    return [
        (
            row.message_id,
            row.status,
            row.attempts,
            [{k: v for k, v in entry.items() if k != "at"} for entry in row.history],
        )
        for row in rows
    ]


@pytest.mark.postgres
def test_an_operators_actions_leave_the_same_rows_whichever_family_writes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    by_postgresql = _after_actions()
    InboxMessage.objects.all().delete()
    monkeypatch.setattr(families, "_FAMILIES", {})
    by_portable = _after_actions()
    assert by_portable == by_postgresql
    assert {status for _, status, _, _ in by_portable} == {Status.RECEIVED, Status.PARKED}


def _portable_cases() -> list[str]:
    """``module.test`` of the ordering and gap tests that take no arguments and test no
    PostgreSQL statement."""
    import inspect

    from tests.unit import test_gaps, test_ordering

    names = []
    for module in (test_ordering, test_gaps):
        for name, test in vars(module).items():
            marks = {mark.name for mark in getattr(test, "pytestmark", [])}
            wanted = name.startswith("test_") and callable(test) and "postgres" not in marks
            if wanted and not inspect.signature(test).parameters:
                names.append(f"{module.__name__.rpartition('.')[2]}.{name}")
    return names


@pytest.mark.postgres
@pytest.mark.parametrize("name", _portable_cases())
def test_ordering_holds_with_the_portable_family_on_postgresql(name: str, portable: None) -> None:
    import importlib

    module, _, test = name.partition(".")
    getattr(importlib.import_module(f"tests.unit.{module}"), test)()


@pytest.mark.server_db
def test_a_portable_lock_that_must_not_wait_reports_a_held_key_busy() -> None:
    """Another transaction holds the key: the portable lock answers ``None`` (busy) at once, and
    the key once it is free. (On MariaDB it waited for the holder instead: see
    ``tests/system/test_mariadb.py``.)"""
    import threading

    from django.db import connections, transaction

    portable = Portable()
    with transaction.atomic():
        portable.lock_key("ordered", "K", 1, "default", wait=True)  # the key's row exists
    held, done = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                assert portable.lock_key("ordered", "K", 1, "default", wait=True) is not None
                held.set()
                done.wait(timeout=30)
        finally:
            connections.close_all()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(timeout=30)
        with transaction.atomic():
            assert portable.lock_key("ordered", "K", 1, "default", wait=False) is None
    finally:
        done.set()
        thread.join()
    with transaction.atomic():
        assert portable.lock_key("ordered", "K", 1, "default", wait=False) is not None
