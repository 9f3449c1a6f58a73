"""What ``scripts/test`` runs besides pytest: its makemigrations phase is a real check that
warns about nothing, on a checkout whose database does not exist yet."""

from __future__ import annotations

import subprocess
import uuid

import pytest
from django.db import connection

from tests.conftest import ROOT


@pytest.mark.postgres
def test_the_makemigrations_phase_creates_its_database_and_does_not_warn(
    db_url: str, subprocess_env: dict[str, str]
) -> None:
    name = f"inbox_scripts_{uuid.uuid4().hex[:8]}"  # a fresh checkout's DATABASE_URL: no such db
    env = {**subprocess_env, "DATABASE_URL": db_url.rsplit("/", 1)[0] + "/" + name}
    try:
        done = subprocess.run(
            ["bash", "-c", "source scripts/lib.sh && makemigrations_check"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name}")

    assert done.returncode == 0, done.stderr
    assert "No changes detected" in done.stdout
    assert "Warning" not in done.stderr, done.stderr
