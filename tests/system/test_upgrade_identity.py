"""Upgrading a PostgreSQL inbox to the digest index of identities, by real ``migrate`` runs in a
database of its own: 0010 builds the digest index while the previous release's insert keeps
deduplicating; 0011 drops the pair constraint; going back restores it. Rows stored before the
upgrade stay duplicates of themselves after it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from subprocess import Popen

import psycopg
import pytest
from django.db import connection

from django_inbox.db.identity import digest_sql

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DATABASE = "inbox_upgrade_test"
TABLE = "django_inbox_inboxmessage"
COLUMNS = (
    "consumer, message_id, source, event_type, key, payload, headers, status, attempts, "
    "last_error, history, received_at, updated_at, lease_id, rerun"
)
VALUES = "%s, %s, '', 't', '', '{}', '{}', 'received', 0, '', '[]', now(), now(), '', false"
#: The previous release's deduplicating insert: it names the pair's constraint.
OLD_INSERT = (
    f"INSERT INTO {TABLE} ({COLUMNS}) VALUES ({VALUES}) "
    "ON CONFLICT (consumer, message_id) DO NOTHING RETURNING id"
)
#: This release's: it names the digest index.
NEW_INSERT = (
    f"INSERT INTO {TABLE} ({COLUMNS}) VALUES ({VALUES}) "
    f"ON CONFLICT (({digest_sql('consumer', 'message_id')})) DO NOTHING RETURNING id"
)


@pytest.fixture
def upgrade_db(db_url: str) -> Iterator[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {DATABASE}")
        cursor.execute(f"CREATE DATABASE {DATABASE}")
    try:
        yield db_url.rsplit("/", 1)[0] + f"/{DATABASE}"
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


def _migrate(manage: Callable[..., Popen[str]], url: str, *target: str, fails: bool = False) -> str:
    proc = manage("migrate", *target, "--verbosity", "0", env={"DATABASE_URL": url})
    _out, err = proc.communicate(timeout=300)
    assert (proc.returncode != 0) is fails, err[-3000:]
    return err


def _insert(url: str, sql: str, consumer: str, message_id: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql, [consumer, message_id]).fetchone() is not None


def _unique_indexes(url: str) -> dict[str, bool]:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c "
            "ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass AND i.indisunique "
            "AND NOT i.indisprimary",
            [TABLE],
        ).fetchall()
    return dict(found)


def test_upgrade_to_the_digest_index_and_back(
    manage: Callable[..., Popen[str]], upgrade_db: str
) -> None:
    url = upgrade_db
    _migrate(manage, url, "django_inbox", "0009")
    with psycopg.connect(url, autocommit=True) as conn:  # a table with history
        conn.execute(
            f"INSERT INTO {TABLE} ({COLUMNS}) SELECT 'orders', 'm-' || i, '', 't', '', '{{}}', "
            "'{}', 'completed', 1, '', '[]', now(), now(), '', false "
            "FROM generate_series(1, 2000) AS i"
        )
    assert _unique_indexes(url) == {"django_inbox_unique_consumer_message": True}

    _migrate(manage, url, "django_inbox", "0010")
    # 0011 refuses to drop the constraint while the digest index is missing (0010 interrupted,
    # or marked applied with --fake): the inbox would be left without deduplication.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX django_inbox_identity_idx")
    err = _migrate(manage, url, "django_inbox", "0011", fails=True)
    assert "django_inbox_identity_idx is missing" in err, err[-3000:]
    # ... or is a unique index of that name on another expression.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE UNIQUE INDEX django_inbox_identity_idx "
            f"ON {TABLE} (md5(consumer || message_id))"
        )
    err = _migrate(manage, url, "django_inbox", "0011", fails=True)
    assert "django_inbox_identity_idx is missing" in err, err[-3000:]
    assert _unique_indexes(url) == {
        "django_inbox_unique_consumer_message": True,
        "django_inbox_identity_idx": True,
    }
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX django_inbox_identity_idx")
    _migrate(manage, url, "django_inbox", "0009")
    _migrate(manage, url, "django_inbox", "0010")
    assert _unique_indexes(url) == {
        "django_inbox_unique_consumer_message": True,
        "django_inbox_identity_idx": True,
    }
    # Behind a transaction that holds the table, 0011 gives up after its lock timeout and
    # changes nothing; run again, it goes through.
    with psycopg.connect(url) as holder:
        holder.execute(f"SELECT id FROM {TABLE} LIMIT 1")
        err = _migrate(manage, url, "django_inbox", "0011", fails=True)
    assert "waited 3s for its lock" in err, err[-3000:]
    assert _unique_indexes(url) == {
        "django_inbox_unique_consumer_message": True,
        "django_inbox_identity_idx": True,
    }
    # Workers of the previous release keep deduplicating meanwhile; so does this release's.
    assert not _insert(url, OLD_INSERT, "orders", "m-7")
    assert _insert(url, OLD_INSERT, "orders", "old-1")
    assert not _insert(url, NEW_INSERT, "orders", "old-1")

    _migrate(manage, url)
    assert _unique_indexes(url) == {"django_inbox_identity_idx": True}
    for message_id in ("m-1", "m-2000", "old-1"):  # stored before: still duplicates
        assert not _insert(url, NEW_INSERT, "orders", message_id)
    assert _insert(url, NEW_INSERT, "orders", "new-1")
    with psycopg.connect(url) as conn:  # a lookup by identity reads the digest index
        conn.execute("ANALYZE " + TABLE)
        plan = conn.execute(
            f"EXPLAIN SELECT id FROM {TABLE} WHERE "
            f"{digest_sql('consumer', 'message_id')} = {digest_sql('%s', '%s')}",
            ["orders", "orders", "m-5"],
        ).fetchall()
    assert "django_inbox_identity_idx" in str(plan), plan
    with pytest.raises(psycopg.errors.InvalidColumnReference):  # why 0011 waits for old workers
        _insert(url, OLD_INSERT, "orders", "old-2")

    _migrate(manage, url, "django_inbox", "0009")
    assert _unique_indexes(url) == {"django_inbox_unique_consumer_message": True}
    assert not _insert(url, OLD_INSERT, "orders", "new-1")
    assert _insert(url, OLD_INSERT, "orders", "old-2")


#: A process of this release that stays up while migrations run: each line it reads names a
#: call (``store``, ``deliver`` or ``store-in-transaction``) and a message id; it answers with
#: the result or the error's type, and ``error`` for anything else.
RUNNING = """
import sys
import django
django.setup()
from django.db import transaction
from django_inbox import deliver, store
for line in sys.stdin:
    call, message_id = line.split()
    args = dict(consumer="effects", message_id=message_id, event_type="effect.write", payload={})
    try:
        if call == "store":
            result = store(**args)
        elif call == "deliver":
            result = deliver(**args).value
        else:
            with transaction.atomic():
                result = store(**args)
    except Exception as exc:
        result = type(exc).__name__
    print(result, flush=True)
"""


class Running:
    """A running process of this release: ``call()`` sends it one call and reads the answer."""

    def __init__(self, env: dict[str, str]) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", RUNNING], env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip

    def call(self, call: str, message_id: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{call} {message_id}\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def test_processes_that_stay_up_while_the_digest_index_is_rolled_back_and_forward(
    manage: Callable[..., Popen[str]], upgrade_db: str, subprocess_env: dict[str, str]
) -> None:
    """The upgrading how-to's "going back" migrates back past 0010 while this release's
    processes run: their inserts named the digest index, which is gone. Each finds out at
    its next insert, builds its statements again and goes on; only a call inside a
    transaction of the caller's own fails, once. Duplicates stay duplicates throughout."""
    url = upgrade_db
    _migrate(manage, url)
    env = {**subprocess_env, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "testproject.settings"}
    alone, in_transaction = Running(env), Running(env)
    try:
        assert alone.call("store", "a-1") == "True"
        assert alone.call("deliver", "a-2") == "processed"
        assert in_transaction.call("store-in-transaction", "t-1") == "True"

        _migrate(manage, url, "django_inbox", "0009")
        assert _unique_indexes(url) == {"django_inbox_unique_consumer_message": True}

        assert alone.call("deliver", "a-3") == "processed", "sent again, built for the table"
        assert alone.call("store", "a-4") == "True"
        assert alone.call("store", "a-1") == "False", "a duplicate is still a duplicate"
        assert alone.call("deliver", "a-2") == "duplicate"
        # Inside the caller's transaction the statement cannot be sent again: one error...
        assert in_transaction.call("store-in-transaction", "t-2") == "IdentityIndexChanged"
        # ... and the next call is built for the table as it is.
        assert in_transaction.call("store-in-transaction", "t-2") == "True"
        assert in_transaction.call("store-in-transaction", "t-1") == "False"

        _migrate(manage, url)  # forward again, the processes still up
        assert _unique_indexes(url) == {"django_inbox_identity_idx": True}
        assert alone.call("store", "a-5") == "True"
        assert alone.call("store", "a-5") == "False"
        assert in_transaction.call("store-in-transaction", "t-3") == "True"
        assert in_transaction.call("store-in-transaction", "t-3") == "False"
    finally:
        alone.close()
        in_transaction.close()
    with psycopg.connect(url) as conn:
        found = conn.execute(f"SELECT message_id FROM {TABLE} ORDER BY message_id").fetchall()
    assert [m for (m,) in found] == ["a-1", "a-2", "a-3", "a-4", "a-5", "t-1", "t-2", "t-3"]
