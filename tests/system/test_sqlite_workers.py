"""Several processes on one SQLite file: 4 ``inbox_process`` workers and 4 processes calling
``store()`` and ``deliver()`` with overlapping ids, on the test project's settings
(``transaction_mode`` ``IMMEDIATE``, a 30 s ``timeout``) and the file in WAL mode. Counted
afterwards: lost 0, doubled 0, and no process saw ``database is locked`` or exited with an
error. Independent of the suite's database: the file is the test's own."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from tests.conftest import MANAGE, ROOT

pytestmark = pytest.mark.slow

IDS = 400  # unique messages; each is sent by two producers
PRODUCERS = 4
WORKERS = 4

#: A producer: stores or delivers its share of ids (every id by two producers, one of them
#: calling deliver(), which runs the handler at once).
PRODUCER = """
import sys
from django_inbox import deliver, store
me, producers, ids = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
for n in range(ids):
    if n % producers not in (me, (me + 1) % producers):
        continue
    call = deliver if (n + me) % 2 else store
    call(consumer="effects", message_id=f"s-{n}", event_type="effect.write", payload={"n": n})
"""


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = url
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "testproject"), str(ROOT)])
    env["INBOX_LOG_LEVEL"] = "ERROR"
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_workers_and_producers_share_one_sqlite_file(tmp_path: Path) -> None:
    if connection.vendor != "sqlite":
        pytest.skip("runs once, in the suite's SQLite phase (its file is its own)")
    path = tmp_path / "inbox.sqlite3"
    env = _env(f"sqlite:///{path}")
    migrate = _run([str(MANAGE), "migrate", "--verbosity", "0"], env)
    _, err = migrate.communicate(timeout=300)
    assert migrate.returncode == 0, err[-3000:]
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"

    script = tmp_path / "producer.py"
    script.write_text("import django\ndjango.setup()\n" + PRODUCER)
    env["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    workers = [
        _run([str(MANAGE), "inbox_process", "--consumer", "effects", "--until-idle", "3"], env)
        for _ in range(WORKERS)
    ]
    producers = [
        _run([str(script), str(me), str(PRODUCERS), str(IDS)], env) for me in range(PRODUCERS)
    ]
    outputs = [(proc, *proc.communicate(timeout=600)) for proc in [*producers, *workers]]
    for proc, _out, err in outputs:
        assert proc.returncode == 0, err[-3000:]
        assert "database is locked" not in err, err[-3000:]

    drain = _run([str(MANAGE), "inbox_process", "--consumer", "effects", "--until-idle", "1"], env)
    _, err = drain.communicate(timeout=300)
    assert drain.returncode == 0, err[-3000:]
    with sqlite3.connect(path) as db:
        counts = dict(
            db.execute("SELECT message_id, count(*) FROM effects_effect GROUP BY message_id")
        )
        statuses = dict(
            db.execute("SELECT status, count(*) FROM django_inbox_inboxmessage GROUP BY status")
        )
    lost = sum(1 for n in range(IDS) if counts.get(f"s-{n}", 0) == 0)
    doubled = sum(1 for n in counts.values() if n > 1)
    assert (lost, doubled) == (0, 0), (lost, doubled)
    assert statuses == {"completed": IDS}, statuses
