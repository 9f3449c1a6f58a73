"""What a duplicate costs: the statements ``deliver()`` sends for one, counted (any database).

A duplicate after a new message costs the insert alone (on PostgreSQL it returns the existing
row's status too); in a run of duplicates, one read-only query and no transaction. The first
new message ends the run.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_inbox import Outcome, deliver
from django_inbox.models import InboxMessage
from tests.effects import effect_counts

pytestmark = pytest.mark.django_db(transaction=True)
TABLE = InboxMessage._meta.db_table


def send(message_id: str, *, redelivered: bool = False) -> tuple[Outcome, list[str]]:
    """Deliver and return the outcome with the statements sent (savepoints and the
    handler's own writes left out)."""
    with CaptureQueriesContext(connection) as queries:
        outcome = deliver(
            consumer="effects", message_id=message_id, event_type="effect.write",
            payload={}, redelivered=redelivered,
        )  # fmt: skip
    sent = [query["sql"] for query in queries.captured_queries]
    return outcome, [sql for sql in sent if TABLE in sql or sql == FAILED]


#: What Django records for a statement that failed on MySQL and MariaDB: mysqlclient keeps no
#: text of it (the insert of a duplicate).
FAILED = "None"


def kinds(statements: list[str]) -> list[str]:
    return [sql.lstrip().split()[0].upper() for sql in statements]


def test_a_duplicate_after_a_new_message_costs_the_insert_alone() -> None:
    assert send("a")[0] == Outcome.PROCESSED

    outcome, sent = send("a")

    assert outcome == Outcome.DUPLICATE
    expected = {
        "postgresql": ["WITH"],
        # the insert refused, then the pair's status read with a lock (the refusal was the
        # pair's)
        "mysql": [FAILED.upper(), "SELECT"],
    }.get(connection.vendor, ["INSERT", "SELECT"])
    assert kinds(sent) == expected, sent
    assert effect_counts() == {"a": 1}


def test_in_a_run_of_duplicates_each_costs_one_read_and_no_transaction() -> None:
    for message_id in "abc":
        send(message_id)
    send("a")  # starts the run

    with CaptureQueriesContext(connection) as everything:
        outcomes = [send(message_id) for message_id in "bc"]

    assert [outcome for outcome, _ in outcomes] == [Outcome.DUPLICATE] * 2
    assert [kinds(sent) for _, sent in outcomes] == [["SELECT"], ["SELECT"]]
    assert not any("SAVEPOINT" in q["sql"] for q in everything.captured_queries)
    assert effect_counts() == {"a": 1, "b": 1, "c": 1}


def test_a_new_message_ends_the_run_and_is_processed_once() -> None:
    send("a")
    send("a")  # a run of duplicates

    outcome, sent = send("new")

    assert outcome == Outcome.PROCESSED
    assert kinds(sent)[0] == "SELECT", "in a run the status is looked up first"
    assert effect_counts() == {"a": 1, "new": 1}
    outcome, sent = send("new")  # the run ended: the insert decides again
    assert outcome == Outcome.DUPLICATE
    assert kinds(sent)[0] in ("WITH", "INSERT", FAILED.upper())


def test_a_redelivered_duplicate_costs_one_read() -> None:
    send("a")

    outcome, sent = send("a", redelivered=True)

    assert outcome == Outcome.DUPLICATE
    assert kinds(sent) == ["SELECT"]
    assert effect_counts() == {"a": 1}


def test_a_redelivered_message_the_inbox_never_saw_counts_the_lost_attempt() -> None:
    outcome, _ = send("lost", redelivered=True)

    assert outcome == Outcome.PROCESSED
    row = InboxMessage.objects.get(consumer="effects", message_id="lost")
    assert row.attempts == 2
    assert [entry["type"] for entry in row.errors] == ["LostAttempt"]
    assert effect_counts() == {"lost": 1}
