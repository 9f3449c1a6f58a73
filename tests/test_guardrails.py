"""What a new user's typo or missing step gets: a sentence and exit 2, never a silent success.

(``inbox_consume``'s own guardrails are in ``test_consume_hostile.py``; ``inbox_replay``'s
required selection in ``test_replay.py``; ``deliver()`` to an unknown consumer in
``test_hostile_input.py``.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from django_inbox import store

Manage = Callable[..., subprocess.Popen[str]]


@pytest.mark.django_db
def test_stats_for_an_unknown_consumer_exits_2_naming_the_known_ones() -> None:
    with pytest.raises(CommandError) as info:
        call_command("inbox_stats", "--consumer", "invnetory", stdout=StringIO())

    assert info.value.returncode == 2
    assert "unknown consumer 'invnetory'" in str(info.value)
    assert "'inventory'" in str(info.value)


@pytest.mark.django_db
def test_stats_for_a_consumer_known_only_by_its_rows_is_fine() -> None:
    from django_inbox import store_dead

    store_dead(consumer="retired", message_id="r-1", event_type="x", payload={}, reason="gone")
    out = StringIO()

    with pytest.raises(CommandError) as info:  # a dead row: exit 1, the problems code
        call_command("inbox_stats", "--consumer", "retired", stdout=out)

    assert info.value.returncode == 1
    assert "retired" in out.getvalue()


@pytest.mark.django_db
def test_stats_for_a_known_consumer_without_rows_is_healthy() -> None:
    out = StringIO()
    call_command("inbox_stats", "--consumer", "inventory", stdout=out)
    assert "healthy" in out.getvalue()


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


@pytest.mark.django_db(transaction=True)
def test_store_then_stats_still_counts_rows() -> None:
    assert store(consumer="effects", message_id="g-1", event_type="effect.write", payload={})
    out = StringIO()
    call_command("inbox_stats", "--consumer", "effects", "--json", stdout=out)
    assert '"received": 1' in out.getvalue()
