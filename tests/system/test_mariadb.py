"""The inbox on MariaDB, by real processes on a database of their own.

Every migration of the inbox and of the outbox applies and reverses, by real ``migrate`` runs:
forward on a fresh database, both apps back to zero, forward again, and back to ``0010`` and
forward (the upgrading how-to's rollback). On MariaDB, DDL cannot be rolled back: ``0007`` ran
its ``ALTER TABLE`` inside a transaction and every ``migrate`` stopped there
(``TransactionManagementError``).

Needs MariaDB at ``INBOX_TEST_MARIADB`` (default ``mysql://root@127.0.0.1:3306``) and
``mysqlclient`` (``./scripts/test`` installs both). Fails, never skips, without them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from importlib import import_module
from subprocess import Popen
from typing import Any

import pytest

#: The subprocesses are started by the suite's ``manage`` fixture, which the PostgreSQL phase
#: provides; the database they migrate is MariaDB's.
pytestmark = pytest.mark.postgres
SERVER = os.environ.get("INBOX_TEST_MARIADB", "mysql://root@127.0.0.1:3306")


def _connect() -> Any:
    """A connection to the server of ``INBOX_TEST_MARIADB``, no database chosen."""
    import MySQLdb

    host, _, port = SERVER.split("@", 1)[1].partition(":")
    user = SERVER.split("//", 1)[1].split("@", 1)[0]
    return MySQLdb.connect(host=host, port=int(port or 3306), user=user)


def _admin(sql: str) -> None:
    with _connect() as conn:
        conn.cursor().execute(sql)


@pytest.fixture
def mariadb() -> Iterator[str]:
    """The URL of a new, empty MariaDB database, dropped afterwards."""
    name = f"inbox_migrations_{uuid.uuid4().hex[:8]}"
    _admin(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
    try:
        yield f"{SERVER}/{name}"
    finally:
        _admin(f"DROP DATABASE IF EXISTS {name}")


def _migrate(manage: Callable[..., Popen[str]], url: str, *target: str) -> None:
    proc = manage("migrate", *target, "--verbosity", "1", env={"DATABASE_URL": url})
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, (out + err)[-3000:]


def _applied(manage: Callable[..., Popen[str]], url: str) -> list[str]:
    proc = manage("showmigrations", "--plan", env={"DATABASE_URL": url})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return [line for line in out.splitlines() if "[X]" in line and "django_inbox" in line]


def test_every_migration_applies_and_reverses_on_mariadb(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    _migrate(manage, mariadb)
    every = _applied(manage, mariadb)
    assert len(every) >= 17, every  # the inbox's 14 and the outbox's 3
    _migrate(manage, mariadb, "django_inbox_outbox", "zero")
    _migrate(manage, mariadb, "django_inbox", "zero")
    assert _applied(manage, mariadb) == []
    _migrate(manage, mariadb)
    _migrate(manage, mariadb, "django_inbox", "0010")
    _migrate(manage, mariadb)
    assert _applied(manage, mariadb) == every


#: Run by ``manage.py shell``: from each migration of the inbox (and of the outbox), back to it
#: and forward to the latest, as an upgrade from a release that stopped there would.
UPGRADES_SCRIPT = """
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader

graph = MigrationLoader(connection).graph
for app in ("django_inbox", "django_inbox_outbox"):
    plan = graph.forwards_plan(graph.leaf_nodes(app)[0])
    names = [name for (label, name) in plan if label == app]
    for name in names[:-1]:
        call_command("migrate", app, name, verbosity=0)
        call_command("migrate", verbosity=0)
        print("upgraded from", app, name)
"""


def test_an_upgrade_from_each_migration_applies_on_mariadb(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    _migrate(manage, mariadb)
    every = _applied(manage, mariadb)
    proc = manage("shell", "-c", UPGRADES_SCRIPT, env={"DATABASE_URL": mariadb})
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, (out + err)[-3000:]
    upgraded = [line for line in out.splitlines() if line.startswith("upgraded from")]
    assert len(upgraded) == len(every) - 2, out  # every migration but each app's last
    assert _applied(manage, mariadb) == every


#: Run by ``manage.py shell`` on MariaDB: a user's unique index on ``(consumer, key,
#: sequence)`` refuses the second row of a version; ``store()`` and ``deliver()`` must raise,
#: not answer a duplicate that nothing stored (the message would be acknowledged and lost).
CONFLICT_SCRIPT = """
from django.db import IntegrityError, connection
from django_inbox import deliver, store
with connection.cursor() as cursor:
    cursor.execute(
        "CREATE UNIQUE INDEX user_version ON django_inbox_inboxmessage (consumer, `key`, sequence)"
    )
message = dict(consumer="effects", event_type="effect.write", payload={}, key="k", sequence=1)
print("first", store(message_id="u-1", **message))
print("copy", store(message_id="u-1", **message))
for call in (store, deliver):
    try:
        print(call.__name__, call(message_id=f"u-2-{call.__name__}", **message))
    except IntegrityError:
        print(call.__name__, "refused")
"""


CALLS = ("first", "copy", "store", "deliver")


def test_only_the_pair_makes_an_insert_a_duplicate_on_mariadb(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    _migrate(manage, mariadb)
    proc = manage("shell", "-c", CONFLICT_SCRIPT, env={"DATABASE_URL": mariadb})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    said = [line for line in out.splitlines() if line.split(" ")[0] in CALLS]
    assert said == [
        "first True",
        "copy False",
        "store refused",
        "deliver refused",
    ], out


#: MariaDB refuses JSON nested 32 levels or more (``json_valid``): such a payload or header is
#: refused up front with a reason naming MariaDB, by ``store()``, ``deliver()`` and the
#: outbox's ``publish()``; 31 levels are stored.
DEPTH_SCRIPT = """
from django.db import transaction
from django_inbox import InvalidPayload, deliver, store
from django_inbox.outbox import publish

def nested(levels):
    value = []
    for _ in range(levels - 1):
        value = [value]
    return value

message = dict(consumer="effects", event_type="effect.write")
print("store31", store(message_id="d-31", payload=nested(31), **message))
for name, call in (
    ("store", lambda: store(message_id="d-32", payload=nested(32), **message)),
    ("deliver", lambda: deliver(message_id="d-32b", payload={"a": nested(31)}, **message)),
    ("headers", lambda: store(
        message_id="d-32c", payload={}, headers={"h": nested(31)}, **message
    )),
    ("publish", lambda: publish("t", nested(32), routing_key="r")),
):
    try:
        with transaction.atomic():
            call()
        print(name, "stored")
    except InvalidPayload as exc:
        print(name, "refused", "MariaDB" in str(exc))
"""


def test_json_too_deep_for_mariadb_is_refused_up_front(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    _migrate(manage, mariadb)
    proc = manage("shell", "-c", DEPTH_SCRIPT, env={"DATABASE_URL": mariadb})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    said = [line for line in out.splitlines() if line.split(" ")[0] in DEPTHS]
    assert said == [
        "store31 True",
        "store refused True",
        "deliver refused True",
        "headers refused True",
        "publish refused True",
    ], out


DEPTHS = ("store31", "store", "deliver", "headers", "publish")


#: Ids and keys that MariaDB's default collations hold equal: each must be its own message (and
#: its own ordered key), run once.
EXACT_SCRIPT = """
from django_inbox import deliver
ids = ["evt-ABC", "evt-abc", "\\u00e9vt-1", "evt-1", "evt-2", "evt-2 "]
ids += ["\\U0001F600", "\\U0001F601"]
for message_id in ids:
    print("id", deliver(consumer="effects", message_id=message_id, event_type="effect.write",
                        payload={}))
for key in ("ORDER-x", "order-x"):
    print("key", deliver(consumer="ordered", message_id=f"{key}-1", event_type="ordered.apply",
                         payload={}, key=key, sequence=1))
for message_id in ids:
    print("again", deliver(consumer="effects", message_id=message_id, event_type="effect.write",
                           payload={}))
"""


def test_ids_and_keys_are_exact_strings_on_mariadb(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    _migrate(manage, mariadb)
    proc = manage("shell", "-c", EXACT_SCRIPT, env={"DATABASE_URL": mariadb})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    said = [line for line in out.splitlines() if line.split(" ")[0] in ("id", "key", "again")]
    assert said == ["id processed"] * 8 + ["key processed"] * 2 + ["again duplicate"] * 8, out


#: Statements that MariaDB refused or computed otherwise (found by running the unit suite on
#: it): purge's batch (a LIMIT inside IN), giving back a row at 0 attempts (attempts - 1 in an
#: unsigned column), a JSON null payload (SQL NULL in a NOT NULL column), and the outbox's claim
#: (an outer column in a derived table; FOR UPDATE OF).
STATEMENTS_SCRIPT = """
from datetime import timedelta
from django.utils import timezone
from django_inbox import store
from django_inbox.models import InboxMessage
from django_inbox.outbox import publish
from django_inbox.outbox import rows as outbox_rows
from django_inbox.processing import leases
from django_inbox.processing.claims import claim_batch
from django_inbox.services import purge

message = dict(consumer="effects", event_type="effect.write")
print("null", store(message_id="n-1", payload=None, **message))
store(message_id="p-1", payload={}, **message)
InboxMessage.objects.filter(message_id="p-1").update(
    status="completed", processed_at=timezone.now() - timedelta(days=400)
)
print("purged", purge(statuses=("completed",), older_than=0).deleted.get("completed"))
store(message_id="g-1", payload={}, **message)
[row] = claim_batch("effects", 1, message_id="g-1")
InboxMessage.objects.filter(pk=row.pk).update(attempts=0)
print("given", leases.release(row, timezone.now(), "default"))
for n in range(3):
    publish("order.placed", {"n": n}, routing_key="orders", key="K")
lease, claimed = outbox_rows.claim(10, "default")
print("claimed", len(claimed))
"""


def test_the_statements_mariadb_refused_work_there(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    _migrate(manage, mariadb)
    proc = manage("shell", "-c", STATEMENTS_SCRIPT, env={"DATABASE_URL": mariadb})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    said = [line for line in out.splitlines() if line.split(" ")[0] in STATEMENTS]
    assert said == ["null True", "purged 1", "given 1", "claimed 1"], out


STATEMENTS = ("null", "purged", "given", "claimed")


#: A worker's lock of a key another transaction holds must not wait (the worker gives the row
#: back and runs other keys): the portable lock went on to ``INSERT IGNORE`` the key, which
#: waits for the holder, here until a 1-second lock wait timeout failed it.
BUSY_KEY_SCRIPT = """
import threading
from django.db import connection, connections, transaction
from django_inbox.families import Portable

portable = Portable()
with transaction.atomic():
    portable.lock_key("ordered", "K", 1, "default", wait=True)
held, done = threading.Event(), threading.Event()

def holder():
    try:
        with transaction.atomic():
            portable.lock_key("ordered", "K", 1, "default", wait=True)
            held.set()
            done.wait(timeout=30)
    finally:
        connections.close_all()

thread = threading.Thread(target=holder)
thread.start()
held.wait(timeout=30)
with connection.cursor() as cursor:
    cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
try:
    with transaction.atomic():
        print("busy", portable.lock_key("ordered", "K", 1, "default", wait=False))
except Exception as exc:
    print("busy", type(exc).__name__)
finally:
    done.set()
    thread.join()
"""


def test_a_worker_never_waits_for_a_held_key_on_mariadb(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    _migrate(manage, mariadb)
    proc = manage("shell", "-c", BUSY_KEY_SCRIPT, env={"DATABASE_URL": mariadb})
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert [line for line in out.splitlines() if line.startswith("busy ")] == ["busy None"], out


def _indexes(url: str, table: str) -> dict[str, list[str]]:
    """Each index of ``table`` in the database at ``url`` (one of :func:`mariadb`'s): its
    columns in order."""
    with _connect() as conn:
        cursor = conn.cursor()
        cursor.execute(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS "
            "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s ORDER BY INDEX_NAME, SEQ_IN_INDEX",
            [url.rsplit("/", 1)[1], table],
        )
        found: dict[str, list[str]] = {}
        for name, column in cursor.fetchall():
            found.setdefault(name, []).append(column)
        return found


def test_partial_indexes_lead_with_status_on_mariadb(
    manage: Callable[..., Popen[str]], mariadb: str
) -> None:
    """MariaDB ignores the conditions of partial indexes: 0014 (and the outbox's 0003) give
    them ``status`` first, under their own names, and add the purge's index; going back
    restores Django's definitions (bench/databases.py explains each statement at 1M rows)."""
    INBOX = import_module("django_inbox.migrations.0014_mysql_status_indexes").INBOX
    OUTBOX = import_module("django_inbox.outbox.migrations.0003_mysql_status_indexes").OUTBOX
    _migrate(manage, mariadb)
    for table, layout in (
        ("django_inbox_inboxmessage", INBOX),
        ("django_inbox_outbox_outboxmessage", OUTBOX),
    ):
        found = _indexes(mariadb, table)
        for name, (columns, _django, _only_here) in layout.items():
            assert found[name] == list(columns), (name, found)
    # The claim's index stays as Django made it: finished rows have no due time.
    polled = _indexes(mariadb, "django_inbox_inboxmessage")["django_inbox_polled_idx"]
    assert polled == ["consumer", "next_attempt_at", "id"]
    _migrate(manage, mariadb, "django_inbox", "0013")
    _migrate(manage, mariadb, "django_inbox_outbox", "0002")
    for table, layout in (
        ("django_inbox_inboxmessage", INBOX),
        ("django_inbox_outbox_outboxmessage", OUTBOX),
    ):
        found = _indexes(mariadb, table)
        for name, (_columns, django, only_here) in layout.items():
            if only_here:
                assert name not in found
            else:
                assert found[name] == list(django or ()), (name, found)


@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("root@{host}/inbox_no_such_database", "Unknown database 'inbox_no_such_database'"),
        ("inbox_no_such_user@{host}/inbox", "Access denied for user 'inbox_no_such_user'"),
    ],
    ids=["no database", "no user"],
)
def test_mariadb_refusing_the_settings_is_exit_2_not_an_outage(
    manage: Callable[..., Popen[str]], where: str, says: str
) -> None:
    """As on PostgreSQL (tests/system/test_guardrails.py): a configuration error is one line
    and exit 2, where an outage is waited for."""
    host = SERVER.split("@", 1)[1]
    url = "mysql://" + where.format(host=host)
    proc = manage("inbox_process", "--until-idle", "1", env={"DATABASE_URL": url})
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert says in err and "configuration error, not an outage" in err, err
    assert "Traceback" not in err
