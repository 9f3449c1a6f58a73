"""What a new user's typo or missing step gets: a sentence and exit 2, never a silent success.

The parts that run real processes; the rest is in ``tests/unit/test_commands.py``.
"""

from __future__ import annotations

import time
import uuid

import pytest
from django.db import connection

from django_inbox import store_dead
from tests.unit.test_commands import (
    Manage,
)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.parametrize(
    "command",
    [
        ("inbox_process", "--until-idle", "1"),
        ("inbox_replay", "--all"),
        ("inbox_purge", "--older-than", "30d"),
        ("inbox_reclaim",),
        ("inbox_show", "m-1"),
    ],
    ids=lambda args: args[0],
)
def test_commands_before_migrate_exit_2_saying_run_migrate(
    manage: Manage, db_url: str, command: tuple[str, ...]
) -> None:
    with connection.cursor() as cursor:
        cursor.execute("DROP DATABASE IF EXISTS inbox_unmigrated_cmd")
        cursor.execute("CREATE DATABASE inbox_unmigrated_cmd")
    try:
        unmigrated = db_url.rsplit("/", 1)[0] + "/inbox_unmigrated_cmd"
        proc = manage(*command, env={"DATABASE_URL": unmigrated})
        _, err = proc.communicate(timeout=60)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP DATABASE IF EXISTS inbox_unmigrated_cmd")

    assert proc.returncode == 2, err
    assert "run 'manage.py migrate' first" in err
    assert "Traceback" not in err


@pytest.mark.postgres
@pytest.mark.parametrize(
    "command",
    [
        ("inbox_replay", "--consumer", "invnetory"),
        ("inbox_replay", "--consumer", "invnetory", "--status", "dead", "--dry-run"),
        ("inbox_purge", "--consumer", "invnetory", "--dry-run"),
        ("inbox_reclaim", "--consumer", "invnetory"),
        ("inbox_show", "m-1", "--consumer", "invnetory"),
        ("inbox_stats", "--consumer", "invnetory"),
        ("inbox_process", "--consumer", "invnetory", "--until-idle", "0"),
        ("inbox_process", "--consumer", "stream", "--consumer", "invnetory", "--until-idle", "0"),
        ("inbox_consume", "--consumer", "invnetory", "--queue", "q", "--broker", "memory://"),
    ],
    ids=" ".join,
)
def test_a_mistyped_consumer_is_one_line_naming_the_known_ones_and_exit_2(
    manage: Manage, command: tuple[str, ...]
) -> None:
    """Every command with ``--consumer`` says a typo is unknown instead of finding nothing."""
    proc = manage(*command)
    out, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert err.strip().splitlines() == [err.strip()], err  # one line
    assert "unknown consumer 'invnetory'" in err
    assert "known consumers: [" in err and "'inventory'" in err
    assert "Traceback" not in err
    assert out == ""


@pytest.mark.postgres
def test_a_consumer_known_only_by_its_rows_can_be_replayed_but_not_processed(
    manage: Manage,
) -> None:
    """A consumer whose handlers are gone still has rows an operator looks after; only the
    commands that run handlers need one."""
    store_dead(consumer="retired", message_id="r-1", event_type="x", payload={}, reason="gone")

    replay = manage("inbox_replay", "--consumer", "retired", "--dry-run")
    out, err = replay.communicate(timeout=60)
    assert replay.returncode == 0, err
    assert "would replay 1 row(s) (dead 1)" in out

    process = manage("inbox_process", "--consumer", "retired", "--until-idle", "0")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2, err
    assert "unknown consumer 'retired': no handler registered" in err


#: The two long-running commands (they take ``--until-idle``).
LONG_RUNNING = [
    ("inbox_process",),
    ("inbox_consume", "--consumer", "stream", "--queue", "q", "--broker", "memory://"),
]


@pytest.mark.postgres
@pytest.mark.parametrize("command", LONG_RUNNING, ids=lambda args: args[0])
@pytest.mark.parametrize(
    ("where", "says"),
    [
        ("postgres@127.0.0.1:5432/inbox_no_such_database", 'database "inbox_no_such_database"'),
        ("inbox_no_such_role@127.0.0.1:5432/postgres", 'role "inbox_no_such_role"'),
    ],
    ids=["no database", "no role"],
)
def test_a_database_refusing_the_settings_is_exit_2_not_an_outage(
    manage: Manage, command: tuple[str, ...], where: str, says: str
) -> None:
    """No such database or role is a configuration error: one line and exit 2, where an
    outage (nothing listening, a restart) is waited for."""
    proc = manage(*command, "--until-idle", "1", env={"DATABASE_URL": f"postgres://{where}"})
    _, err = proc.communicate(timeout=60)

    assert proc.returncode == 2, err
    assert err.strip().splitlines() == [err.strip()], err
    assert f"{says} does not exist" in err and "configuration error, not an outage" in err
    assert "Traceback" not in err


@pytest.mark.postgres
@pytest.mark.parametrize(
    "command",
    [*LONG_RUNNING, ("outbox_relay", "--broker", "amqp://guest:guest@127.0.0.1:5672//")],
    ids=lambda args: args[0],
)
def test_a_database_dropped_under_a_running_command_ends_it_with_exit_2(
    manage: Manage, db_url: str, command: tuple[str, ...]
) -> None:
    """Lost first (its connection terminated: an outage, waited for), then refused on
    reconnecting (no such database): the command does not wait for ever."""
    name = f"inbox_dropped_{uuid.uuid4().hex[:8]}"
    url = db_url.rsplit("/", 1)[0] + "/" + name
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        migrate = manage("migrate", "-v", "0", env={"DATABASE_URL": url})
        assert migrate.wait(timeout=120) == 0, migrate.communicate()[1]
        proc = manage(*command, "--until-idle", "600", env={"DATABASE_URL": url})
        deadline = time.monotonic() + 60
        while not _connected(name) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.2)
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")
        _, err = proc.communicate(timeout=120)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    assert proc.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("CommandError: the inbox's database 'default' refused"), err
    assert f'database "{name}" does not exist' in last
    assert "Traceback" not in err


def _connected(database: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database])
        return bool(cursor.fetchone()[0])


@pytest.mark.postgres
def test_a_database_not_encoded_in_utf8_is_a_warning_of_the_database_checks(
    manage: Manage, db_url: str
) -> None:
    """On LATIN1 an emoji in a payload is a DataError, which a consumer requeues for ever."""
    with connection.cursor() as cursor:
        cursor.execute("DROP DATABASE IF EXISTS inbox_latin1_test")
        cursor.execute(
            "CREATE DATABASE inbox_latin1_test TEMPLATE template0 ENCODING 'LATIN1' "
            "LC_COLLATE 'C' LC_CTYPE 'C'"
        )
    try:
        latin1 = db_url.rsplit("/", 1)[0] + "/inbox_latin1_test"
        found = {}
        for url in (latin1, db_url):
            proc = manage("check", "--database", "default", env={"DATABASE_URL": url})
            _, err = proc.communicate(timeout=60)
            found[url] = err
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP DATABASE IF EXISTS inbox_latin1_test")

    assert "django_inbox.W005" in found[latin1] and "encoded in LATIN1" in found[latin1]
    assert "W005" not in found[db_url]
