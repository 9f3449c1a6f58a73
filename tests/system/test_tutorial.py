"""docs/tutorial.md runs as written, against the real RabbitMQ, and prints what it shows.

The test reads the page itself (no copy): it writes the page's files and runs its commands in
order in a fresh directory, and fails when a command fails or prints something other than the
page shows. What it has to do differently from a reader (no ``pip install`` into the shared
virtualenv, a queue of its own, ``Killed`` for a SIGKILLed process) is listed in
tests/tutorial_support/tutorial.py. Then it counts the effects in the tutorial's own SQLite
database, without the page's report command.
"""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest

from tests.tutorial_support.tutorial import (
    PAGE_BROKER,
    TUTORIAL,
    Command,
    Result,
    Run,
    TutorialError,
    broker_problem,
    delete_queues,
    new_queue,
    normalise,
    parse,
    read_pages,
)

BROKER = os.environ.get("INBOX_TEST_RABBITMQ", PAGE_BROKER)


@pytest.mark.slow
def test_the_tutorial_runs_as_written_and_applies_each_order_once(tmp_path: Path) -> None:
    problem = broker_problem(BROKER)
    # Fails, never skips: a run without RabbitMQ has not shown that the tutorial works (the
    # scripts start RabbitMQ; INBOX_TEST_RABBITMQ names another).
    assert not problem, f"the tutorial needs RabbitMQ at {BROKER}: {problem}"
    steps = read_pages()  # part 1, then part 2 (the outbox) in the same project
    run = Run(tmp_path.resolve(), new_queue(), BROKER)
    try:
        run.run(steps)  # raises at the first command that fails or prints otherwise
    finally:
        delete_queues(run)

    # The run was isolated: the page's queue was renamed in the consumer commands and in
    # publish.py, and nothing but this run published to it.
    assert run.replaced["queue"] >= 4 and run.replaced["queue in files"] >= 1, run.replaced
    assert BROKER == PAGE_BROKER or run.replaced["broker"] >= 2, run.replaced

    # The page still shows what it is about: a duplicate, a crash, a retry.
    printed = {r.ran: r for r in run.results}
    consumes = [r for r in run.results if "inbox_consume" in r.ran]
    assert any("(duplicate 1, processed 1)" in line for r in consumes for line in r.output)
    killed = [r for r in consumes if r.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL)]
    assert len(killed) == 1, [(r.ran, r.returncode) for r in consumes]
    after_kill = consumes[consumes.index(killed[0]) + 1]
    assert normalise(after_kill.output) == [
        "inbox_consume: consumer 'inventory', queue 'orders' (declared durable if missing), "
        "broker amqp://guest:**@localhost:5672//; ack after-process, prefetch 100, commit every 1",
        "inbox_consume: acked 1 (processed 1), refused 0, requeued 0, reconnects 0",
    ]
    assert any("inbox_process" in ran for ran in printed)

    # The effects, read from the tutorial's database directly: each order applied once.
    database = run.cwd / "db.sqlite3"
    with sqlite3.connect(database) as db:
        stock = dict(db.execute("SELECT sku, qty FROM shop_stock"))
        rows = {
            message_id: (status, attempts)
            for message_id, status, attempts in db.execute(
                "SELECT message_id, status, attempts FROM django_inbox_inboxmessage"
            )
        }
        outbox = list(
            db.execute("SELECT event_type, status, causation_message_id FROM "
                       "django_inbox_outbox_outboxmessage")
        )  # fmt: skip
    # A1: 10 - 3 (order-1, published twice) - 2 (order-2, killed once) - 1 (order-5) = 4;
    # order-4 (0) dead. B2: 5 - 1 (order-3, failed once, retried). C3 does not exist.
    assert stock == {"A1": 4, "B2": 4}
    inbox = {message_id: row for message_id, row in rows.items() if message_id.startswith("order")}
    assert inbox == {
        "order-1": ("completed", 1),
        "order-2": ("completed", 2),
        "order-3": ("completed", 2),
        "order-4": ("dead", 1),
        "order-5": ("completed", 1),
        "order-6": ("failed", 1),
    }
    # Part 2: one event, for order-5 (order-6's was rolled back with its failure), published
    # twice and run once by the shipping consumer.
    assert outbox == [("stock.reserved", "sent", "order-5")]
    shipping = [row for message_id, row in rows.items() if not message_id.startswith("order")]
    assert shipping == [("completed", 1)]
    assert any(
        "(duplicate 1)" in line for r in consumes if "shipping" in r.ran for line in r.output
    )
    assert not (run.cwd / "power-cut").exists()


# -- the checker itself: it must be able to fail -------------------------------------------


def check(expected: list[str], printed: list[str], returncode: int = 0) -> None:
    command = Command(1, "python manage.py report", expected)
    Run(Path("/nonexistent"), "q").verify(Result(command, command.text, returncode, printed))


def test_the_checker_accepts_the_same_output_up_to_times_and_durations() -> None:
    check(
        [
            "inbox inventory/order.placed order-3 attempt 1: failed (LookupError) in 7.8 ms; "
            "retry at 2026-11-22T04:01:16.754085+00:00",
            "stock A1: 5",
            "...",
        ],
        [
            "inbox inventory/order.placed order-3 attempt 1: failed (LookupError) in 12 ms; "
            "retry at 2031-01-02T03:04:05.000001+00:00",
            "stock A1: 5",
            "more",
            "lines",
            "",
        ],
    )


@pytest.mark.parametrize(
    ("expected", "printed", "returncode"),
    [
        (["stock A1: 5"], ["stock A1: 4"], 0),  # a different line
        (["stock A1: 5"], ["stock A1: 5", "stock B2: 4"], 0),  # an extra line
        (["stock A1: 5", "stock B2: 4"], ["stock A1: 5"], 0),  # a missing line
        ([], ["Traceback (most recent call last):"], 0),  # output where the page shows none
        (["stock A1: 5"], ["stock A1: 5"], 1),  # the command failed
        (["Killed"], ["Killed"], 0),  # the page says killed, it exited
        (["healthy"], ["Killed"], -signal.SIGKILL),  # killed where the page says not
        (["CommandError: 1 problem(s) found"], ["CommandError: 1 problem(s) found"], 0),
    ],
)
def test_the_checker_refuses_what_the_page_does_not_show(
    expected: list[str], printed: list[str], returncode: int
) -> None:
    with pytest.raises(TutorialError):
        check(expected, printed, returncode)


@pytest.mark.parametrize(
    "block",
    [
        "```python\nprint('a python block that names no file')\n```\n",
        "```pycon\n>>> 1 + 1\n2\n```\n",
        "```\nno language\n```\n",
        "```console\noutput before any $ command\n```\n",
    ],
)
def test_the_page_can_hold_only_blocks_the_test_runs(block: str) -> None:
    with pytest.raises(TutorialError):
        parse(block)


def test_the_page_is_read_into_files_and_commands() -> None:
    steps = parse(TUTORIAL.read_text())
    files = [s.path for s in steps if not isinstance(s, Command)]
    commands = [s.text for s in steps if isinstance(s, Command)]
    assert files[:2] == ["mysite/settings.py", "shop/models.py"]
    assert {"shop/inbox_handlers.py", "publish.py"} <= set(files)
    assert commands[0] == "mkdir inbox-tutorial"
    assert sum("inbox_consume" in c for c in commands) == 4
