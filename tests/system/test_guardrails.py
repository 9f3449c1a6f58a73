"""What a new user's typo or missing step gets: a sentence and exit 2, never a silent success.

The parts that run real processes; the rest is in ``tests/unit/test_commands.py``.
"""

from __future__ import annotations

import pytest
from django.db import connection

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
