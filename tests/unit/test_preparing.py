"""The inbox's own statements are prepared on PostgreSQL, and preparing stops safely where the
server cannot keep prepared statements (a pooler in transaction mode, a schema change)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.backends.postgresql.base import DatabaseWrapper
from django.test import override_settings
from effects.models import Effect

from django_inbox import Outcome, deliver
from django_inbox.db import preparing, statements
from django_inbox.db.connection import connection_lost
from django_inbox.models import InboxMessage
from tests.effects import effect_counts

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
TABLE = InboxMessage._meta.db_table


def send(message_id: str) -> Outcome:
    return deliver(consumer="effects", message_id=message_id, event_type="effect.write", payload={})


def prepared() -> list[tuple[str, str]]:
    """The prepared statements of this session that touch the inbox table: (name, text)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, statement FROM pg_prepared_statements")
        return [(name, sql) for name, sql in cursor.fetchall() if TABLE in sql]


def forget_prepared_statements_behind_psycopgs_back() -> None:
    """What a pooler in transaction mode does: this server connection no longer knows them."""
    result = connection.connection.pgconn.exec_(b"DEALLOCATE ALL")
    assert result.status == 1, result.error_message  # COMMAND_OK


def test_the_hot_statements_are_prepared_from_their_second_use() -> None:
    assert send("a") == Outcome.PROCESSED
    assert prepared() == [], "a statement sent once is not prepared"

    for message_id in ("b", "c", "b"):
        send(message_id)

    texts = [sql for _, sql in prepared()]
    assert any(sql.startswith("WITH inserted AS (INSERT") for sql in texts), texts
    names = [name for name, _ in prepared()]
    assert not {"_pg3_0", "_pg3_1"} & set(names), "names start at a random number"
    assert effect_counts() == {"a": 1, "b": 1, "c": 1}


def test_uses_are_counted_per_connection_so_short_lived_connections_prepare_nothing() -> None:
    """Celery closes Django's connections around every task, CONN_MAX_AGE = 0 after every
    request: a statement sent once per connection would pay a PREPARE round trip each time."""
    for message_id in ("a", "b", "c"):
        connection.close()  # as Celery's Django fixup does before each task
        assert send(message_id) == Outcome.PROCESSED
        assert prepared() == [], "sent once on this connection: not prepared"

    send("d")  # the second time on this connection
    texts = [sql for _, sql in prepared()]
    assert any(sql.startswith("WITH inserted AS (INSERT") for sql in texts), texts
    assert effect_counts() == {"a": 1, "b": 1, "c": 1, "d": 1}


@override_settings(INBOX_PREPARED_STATEMENTS=False)
def test_the_setting_turns_it_off() -> None:
    for message_id in ("a", "b", "c", "a"):
        send(message_id)

    assert prepared() == []
    assert preparing.enabled("default") is False


def test_prepare_threshold_none_written_in_options_turns_it_off() -> None:
    options = connection.settings_dict.setdefault("OPTIONS", {})
    options["prepare_threshold"] = None
    try:
        assert preparing.enabled("default") is False
    finally:
        del options["prepare_threshold"]
    assert preparing.enabled("default") is True


def test_a_backend_that_makes_its_own_cursors_keeps_djangos_cursor() -> None:
    class Instrumented(DatabaseWrapper):
        def create_cursor(self, name: Any = None) -> Any:
            return super().create_cursor(name)

    assert preparing._plain_backend(connections["default"]) is True
    assert preparing._plain_backend(Instrumented(connection.settings_dict)) is False


def test_statements_the_server_forgot_are_sent_again_unprepared_outside_a_transaction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    send("a")
    for _ in range(2):
        assert statements.current_status("effects", "a", "default") == "completed"
    assert prepared(), "the status query is prepared"
    forget_prepared_statements_behind_psycopgs_back()

    with caplog.at_level(logging.WARNING, logger="django_inbox"):
        status = statements.current_status("effects", "a", "default")

    assert status == "completed"
    assert preparing.state.stopped is True
    assert "stops preparing" in caplog.text and "INBOX_PREPARED_STATEMENTS" in caplog.text
    for message_id in ("b", "c", "b"):
        send(message_id)
    assert prepared() == [], "nothing is prepared after the server refused"
    assert effect_counts() == {"a": 1, "b": 1, "c": 1}


def test_a_transaction_lost_to_a_forgotten_statement_is_not_the_handlers_failure() -> None:
    for message_id in ("a", "b"):
        send(message_id)  # the insert is prepared on the second
    forget_prepared_statements_behind_psycopgs_back()

    with pytest.raises(Exception) as raised:
        send("c")  # the insert runs in deliver()'s transaction, which the error aborts

    assert connection_lost(raised.value, "default") is True
    assert not InboxMessage.objects.filter(message_id="c").exists(), "nothing is stored"
    assert send("c") == Outcome.PROCESSED, "the sender's next try goes through, unprepared"
    assert effect_counts() == {"a": 1, "b": 1, "c": 1}


def test_only_prepared_statement_trouble_stops_preparing() -> None:
    class Failure(Exception):
        def __init__(self, sqlstate: str, text: str) -> None:
            super().__init__(text)
            self.sqlstate = sqlstate

    assert preparing._prepared_statement_trouble(Failure("26000", "does not exist"))
    assert preparing._prepared_statement_trouble(Failure("42P05", "already exists"))
    assert preparing._prepared_statement_trouble(
        Failure("0A000", "cached plan must not change result type")
    )
    assert not preparing._prepared_statement_trouble(Failure("0A000", "feature not supported"))
    assert not preparing._prepared_statement_trouble(Failure("23505", "unique violation"))


def test_a_worker_that_loses_a_prepared_statement_tries_again_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from django_inbox import store
    from django_inbox.processing import claims
    from django_inbox.processing.worker import Worker

    def drain() -> dict[str, int]:
        return dict(Worker(["effects"], until_idle=0, poll_interval=0.01).run().outcomes)

    for message_id in ("a", "b"):
        store(consumer="effects", message_id=message_id, event_type="effect.write", payload={})
    assert drain() == {"processed": 2}  # the claim and the completion are prepared by now
    store(consumer="effects", message_id="c", event_type="effect.write", payload={})
    forget_prepared_statements_behind_psycopgs_back()
    # The next claim takes the general path (it looks for dead workers' rows, unprepared), so
    # the first prepared statement sent is the completion, inside the handler's transaction.
    claims._takeover_checked.clear()

    with caplog.at_level(logging.WARNING, logger="django_inbox"):
        assert drain() == {"processed": 1}

    assert preparing.state.stopped is True
    assert "trying again unprepared" in caplog.text
    assert "lost the database connection" not in caplog.text
    row = InboxMessage.objects.get(message_id="c")
    assert (row.status, row.attempts) == ("completed", 1)
    assert effect_counts() == {"a": 1, "b": 1, "c": 1}


def test_prepared_reads_give_timestamps_in_the_connections_time_zone_as_it_changes() -> None:
    """A claim's rows come back through the inbox's prepared cursor: with ``USE_TZ`` on, as
    aware datetimes; switched off on the same connection, as naive ones (as the ORM reads
    them); on again, aware. The cursor's time zone follows Django's connection's."""
    from django_inbox import store
    from django_inbox.processing.claims import claim_batch

    for n in range(6):
        store(consumer="effects", message_id=f"tz-{n}", event_type="effect.write", payload={})
    first = claim_batch("effects", 2)
    assert all(row.received_at.tzinfo is not None for row in first)
    with override_settings(USE_TZ=False):
        naive = claim_batch("effects", 2)
        by_orm = InboxMessage.objects.get(pk=naive[0].pk).received_at
        assert naive[0].received_at.tzinfo is None
        assert naive[0].received_at == by_orm
    again = claim_batch("effects", 2)
    assert all(row.received_at.tzinfo is not None for row in again)
    assert connection.connection in preparing.state.adopted  # they came through it


# -- the prepared insert inside deliver()'s transaction -------------------------------------------


def test_a_failing_handler_rolls_back_the_prepared_insert_with_its_writes() -> None:
    send("warm-up")
    outcome = deliver(
        consumer="effects", message_id="f", event_type="effect.write", payload={"fail_always": 1}
    )

    assert outcome == Outcome.FAILED
    row = InboxMessage.objects.get(message_id="f")
    assert (row.status, row.attempts) == ("failed", 1), "recorded in a transaction of its own"
    assert effect_counts() == {"warm-up": 1}, "the handler's write went with the rollback"
    # The connection is left as atomic() expects it: the next atomic() still rolls back whole.
    with pytest.raises(RuntimeError), transaction.atomic():
        Effect.objects.create(consumer="plain", message_id="x", attempt=1, pid=0)
        raise RuntimeError("undo")
    assert not Effect.objects.filter(consumer="plain").exists()


def test_an_insert_refused_by_another_index_is_a_database_error_and_stores_nothing() -> None:
    """A unique index of the user's refuses the prepared insert: Django's IntegrityError (not
    psycopg's, and not a duplicate), with nothing stored and the connection usable."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE UNIQUE INDEX test_one_key ON \"{TABLE}\" (key) WHERE key <> ''")
    try:
        send("warm-up")
        first = deliver(
            consumer="effects", message_id="k1", event_type="effect.write", payload={}, key="same"
        )
        with pytest.raises(IntegrityError):
            deliver(
                consumer="effects",
                message_id="k2",
                event_type="effect.write",
                payload={},
                key="same",
            )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX test_one_key")

    assert first == Outcome.PROCESSED
    assert not InboxMessage.objects.filter(message_id="k2").exists()
    assert effect_counts() == {"warm-up": 1, "k1": 1}
    assert send("after") == Outcome.PROCESSED


def test_inside_the_callers_own_transaction_the_insert_joins_it() -> None:
    """deliver() in a transaction that has begun (a view under ATOMIC_REQUESTS): the insert is
    sent as usual, and the caller's rollback takes the row and the handler's write with it."""
    with pytest.raises(RuntimeError), transaction.atomic():
        InboxMessage.objects.exists()  # the caller's own first statement
        assert send("inside") == Outcome.PROCESSED
        raise RuntimeError("the caller fails")

    assert not InboxMessage.objects.filter(message_id="inside").exists()
    assert effect_counts() == {}
