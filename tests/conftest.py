"""Shared fixtures. Tests run against the database in ``DATABASE_URL`` (PostgreSQL, MariaDB
and SQLite in CI): those marked ``postgres`` are skipped on the others, those marked
``server_db`` (several processes or connections sharing the test database) on SQLite."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

from django_inbox.registry import Handler, registry
from tests import brokers

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "testproject" / "manage.py"


def pytest_configure(config: pytest.Config) -> None:
    """The tests that press Ctrl-C send SIGINT to the commands they start. A suite started in
    the background of a shell without job control (``cmd &``, ``nohup``) inherits SIGINT
    ignored, and so would every command it starts: their Ctrl-C was then lost (a failure, and
    a test waiting for ever at a prompt). The suite takes the default back, so that its
    commands get Python's own handling of SIGINT, as from a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if connection.vendor == "postgresql":
        return
    postgres = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL)")
    server = pytest.mark.skip(reason="needs a database server: PostgreSQL or MariaDB")
    for item in items:
        if "postgres" in item.keywords:
            item.add_marker(postgres)
        elif "server_db" in item.keywords and connection.vendor == "sqlite":
            item.add_marker(server)


#: The URL scheme and default user and port of each server the suite runs on.
SERVERS = {"postgresql": ("postgres", "postgres", 5432), "mysql": ("mysql", "root", 3306)}


@pytest.fixture
def db_url(transactional_db: None) -> str:
    """A DATABASE_URL that points subprocesses at the test database."""
    settings = connection.settings_dict
    assert connection.vendor in SERVERS, "subprocess tests need PostgreSQL or MariaDB"
    scheme, default_user, default_port = SERVERS[connection.vendor]
    user = settings.get("USER") or default_user
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    host = settings.get("HOST") or "127.0.0.1"
    port = settings.get("PORT") or default_port
    return f"{scheme}://{user}{password}@{host}:{port}/{settings['NAME']}"


@pytest.fixture
def subprocess_env(db_url: str) -> dict[str, str]:
    return process_env(db_url)


def process_env(db_url: str) -> dict[str, str]:
    """The environment of a testproject process on the database at ``db_url``."""
    env = dict(os.environ)
    env["DATABASE_URL"] = db_url
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "testproject"), str(ROOT)])
    env.setdefault("INBOX_LOG_LEVEL", "ERROR")
    # As in production: with the test project's DEBUG on, Django logs every query, and the
    # inbox then prepares none of its statements (django_inbox.db.preparing), so the
    # processes would run a path production does not.
    env.setdefault("DEBUG", "0")
    return env


@pytest.fixture
def manage(subprocess_env: dict[str, str]) -> Callable[..., subprocess.Popen[str]]:
    """Start ``manage.py <args>`` as a real process against the test database."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(MANAGE), *args],
            env={**subprocess_env, **(env or {})},
            stdin=subprocess.DEVNULL,  # never a terminal: no command waits for an answer
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture
def rabbitmq_node() -> Iterator[brokers.RabbitNode]:
    """A RabbitMQ node of this test's own (:func:`tests.brokers.private_rabbitmq`): a test that
    restarts its broker restarts this one, never the machine's, which other runs share."""
    with brokers.private_rabbitmq() as node:
        yield node


def kill_at_random(
    start: Callable[[], subprocess.Popen[str]],
    rng: random.Random,
    *,
    processes: int = 2,
    kills: int = 10,
    pause: tuple[float, float] = (1.0, 3.0),
    deadline: float = 600.0,
) -> int:
    """Run ``processes`` of ``start()`` while SIGKILLing one at random every ``pause`` seconds
    (``kills`` times at most) and starting a new one in its place, until all have exited by
    themselves. Returns the kills."""
    running = [start() for _ in range(processes)]
    killed = 0
    stop = time.monotonic() + deadline
    while any(proc.poll() is None for proc in running) and time.monotonic() < stop:
        time.sleep(rng.uniform(*pause))
        alive = [proc for proc in running if proc.poll() is None]
        if killed < kills and alive:
            victim = rng.choice(alive)
            victim.kill()
            victim.wait()
            killed += 1
            running[running.index(victim)] = start()
    for proc in running:
        proc.communicate(timeout=120)
    return killed


def restart_until_it_survives(start: Callable[[], subprocess.Popen[str]], bound: int) -> int:
    """Start a worker again each time SIGKILL ends it, until one exits by itself.

    ``bound`` caps the restarts (a test expects to end well before it). Returns the kills.
    """
    kills = 0
    for _ in range(bound):
        proc = start()
        _, err = proc.communicate(timeout=120)
        if proc.returncode == -signal.SIGKILL:
            kills += 1
            continue
        assert proc.returncode == 0, err[-3000:]
        break
    return kills


@contextmanager
def handler(
    event_type: str, consumer: str, func: Callable[..., object], **options: object
) -> Iterator[None]:
    """Register ``func`` for the duration of a test."""
    registry.register(Handler(consumer=consumer, event_type=event_type, func=func, **options))  # type: ignore[arg-type]
    try:
        yield
    finally:
        registry.unregister(consumer, event_type)


def forget_process_memory() -> None:
    """Empty what the inbox remembers per process: the consumers in a run of duplicates,
    whether prepared statements were stopped, when each consumer last looked for expired
    leases, whether the pair's constraint exists, the interrupted rows to give back."""
    from django_inbox.db import preparing
    from django_inbox.db.statements import common
    from django_inbox.intake import delivery
    from django_inbox.processing import claims, interruptions

    delivery._duplicate_run.clear()
    preparing.state.reset()
    claims._takeover_checked.clear()
    common._pair_constraint.clear()
    interruptions._noted.clear()


@pytest.fixture(autouse=True)
def _fresh_process_memory() -> Iterator[None]:
    """Every test starts with the per-process memory of a new process, and leaves none."""
    forget_process_memory()
    yield
    forget_process_memory()
