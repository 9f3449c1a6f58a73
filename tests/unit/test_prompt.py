"""The commands' yes/no question: Ctrl-C interrupts it whenever it arrives, even in the instant
between the question shown and the read begun (where ``input()`` swallows it: 1 run in 200
hung when SIGINT was sent as soon as the question appeared)."""

from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

ASK = "from django_inbox.management.prompt import ask; print(repr(ask('Go? [y/N] ')))"
#: Rounds of the race: with input() in place of ask(), 1 round in 200 hung here.
ROUNDS = 300


def _asking() -> tuple[subprocess.Popen[bytes], int]:
    terminal, its_side = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", ASK], stdin=its_side, stdout=its_side, stderr=its_side
    )
    os.close(its_side)
    shown = b""
    while b"[y/N]" not in shown:
        assert select.select([terminal], [], [], 30)[0], f"no question in 30 s: {shown!r}"
        chunk = os.read(terminal, 1024)
        assert chunk, shown
        shown += chunk
    return proc, terminal


def _output(terminal: int) -> str:
    said = b""
    while True:
        assert select.select([terminal], [], [], 30)[0], f"no end in 30 s: {said!r}"
        try:
            chunk = os.read(terminal, 1024)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        said += chunk
    return said.decode()


def _interrupted_at_once() -> str:
    """One round: Ctrl-C as soon as the question shows; how the command ended."""
    proc, terminal = _asking()
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return "hung"
    finally:
        os.close(terminal)
    # An uncaught KeyboardInterrupt ends Python by SIGINT: anything else is another end.
    return "interrupted" if proc.returncode == -signal.SIGINT else f"exited {proc.returncode}"


@pytest.mark.slow
def test_ctrl_c_the_instant_the_question_is_shown_always_interrupts() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("runs once, in the suite's PostgreSQL phase (a terminal, not a database)")
    with ThreadPoolExecutor(4) as rounds:  # four at a time: the race, not the cores, is tested
        ends = Counter(rounds.map(lambda _: _interrupted_at_once(), range(ROUNDS)))
    assert ends == {"interrupted": ROUNDS}


@pytest.mark.parametrize(
    ("typed", "answer"), [(b"yes\n", "'yes'"), (b"\n", "''"), (b"\x04", "None")]
)
def test_the_line_typed_or_none_at_end_of_input(typed: bytes, answer: str) -> None:
    proc, terminal = _asking()
    os.write(terminal, typed)
    said = _output(terminal)
    assert proc.wait(timeout=10) == 0, said
    os.close(terminal)
    assert said.strip().splitlines()[-1] == answer, said
