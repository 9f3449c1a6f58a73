"""Run docs/tutorial.md and its part 2, docs/tutorial-outbox.md, as they are written: their
files written, their commands run, their outputs compared with what the pages show.

The page's conventions, which :func:`parse` enforces (anything else fails, so no block of the
page goes untested):

- ```` ```console ```` blocks: a line starting with ``$ `` is a command (a trailing ``\\``
  continues it on the next line); the lines after it, up to the next command, are what it
  prints. A line that is only ``...`` stands for any number of lines.
- ```` ```python ```` blocks are files. The first line names the file: ``# shop/models.py``
  (create or replace it) or ``# at the end of mysite/settings.py`` (append to it). The block,
  marker line included, is what the reader pastes, so it is written as it is.
- ```` ```text ```` blocks are shown, not run.

What differs from a reader's terminal, and why (:data:`SUBSTITUTIONS`, :class:`Run`):

- the steps that set up the reader's machine are replaced by checks: creating and activating a
  virtualenv (the test runs with this checkout's ``.venv/bin`` first on ``PATH``, so ``python``,
  ``django-admin`` and ``pip`` are that virtualenv's), ``pip install`` (the shared virtualenv
  must not be changed: the test checks instead that ``django_inbox`` imports from this
  checkout), and starting RabbitMQ in Docker (the test checks that RabbitMQ answers);
- the queue ``orders`` is renamed to a queue of this run, so that runs and other tests sharing
  the broker cannot see each other's messages, and the broker URL is replaced when
  ``INBOX_TEST_RABBITMQ`` points elsewhere (in what the commands print, both are shown back
  as the page's);
- stderr is merged into stdout and Python runs unbuffered, so the lines interleave as in a
  terminal; a process killed by ``SIGKILL`` prints ``Killed``, as an interactive bash reports it;
- times and durations are normalised on both sides (``2026-11-22T04:01:16.754085+00:00``,
  ``in 7.8 ms``): they differ on every run.

A command must exit 0, unless what the page shows ends with ``Killed`` (it must have been
killed by ``SIGKILL``) or contains a ``CommandError:`` line (it must exit non-zero).

``python -m tests.tutorial_support.tutorial`` runs the page in a temporary directory and prints
each command with what it printed, to update the page after a deliberate change.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
#: Part 2 (the outbox) continues in part 1's project: the two run as one page.
TUTORIAL_OUTBOX = ROOT / "docs" / "tutorial-outbox.md"
PAGES = (TUTORIAL, TUTORIAL_OUTBOX)
#: The virtualenv the tests run in: its bin directory goes first on the commands' PATH.
VENV = Path(sys.prefix)
#: The broker URL and the queue as the page writes them.
PAGE_BROKER = "amqp://guest:guest@localhost:5672//"
PAGE_QUEUE = "orders"
#: Part 2's second queue (the shipping service's), renamed the same way.
PAGE_QUEUE_2 = "parcels"

FENCE = re.compile(r"^```(?P<info>.*)$")
FILE_MARKER = re.compile(r"^# (?P<append>at the end of )?(?P<path>[\w./-]+)$")
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
DURATION = re.compile(r"\bin \d+(\.\d+)? ?(µs|ms|s)\b")
BASH_KILLED = re.compile(r"^(bash: )?(line \d+: )?\s*\d+ Killed\s.*$")


class TutorialError(AssertionError):
    """The page broke one of its conventions, or a step did not do what the page says."""


@dataclass
class Command:
    line: int  # 1-based line of the page
    text: str
    expected: list[str] = field(default_factory=list)


@dataclass
class FileBlock:
    line: int
    path: str
    append: bool
    content: str


Step = Command | FileBlock


def parse(markdown: str) -> list[Step]:
    """The page's commands and files, in order."""
    steps: list[Step] = []
    lines = markdown.splitlines()
    n = 0
    while n < len(lines):
        fence = FENCE.match(lines[n])
        if not fence:
            if lines[n].lstrip().startswith("```"):
                raise TutorialError(f"line {n + 1}: indented fence; the parser reads top level")
            n += 1
            continue
        language = fence["info"].strip().split(" ")[0]
        start = n + 1
        end = start
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if end == len(lines):
            raise TutorialError(f"line {n + 1}: unclosed fence")
        body = lines[start:end]
        if language == "console":
            steps.extend(_commands(body, start + 1))
        elif language == "python":
            marker = FILE_MARKER.match(body[0]) if body else None
            if not marker:
                raise TutorialError(
                    f"line {start + 1}: a python block must start with '# <path>' or "
                    f"'# at the end of <path>', not {body[:1]!r}"
                )
            steps.append(
                FileBlock(start + 1, marker["path"], bool(marker["append"]), "\n".join(body) + "\n")
            )
        elif language != "text":
            raise TutorialError(
                f"line {n + 1}: block of {language or 'no language'!r}: only console, python "
                "(files) and text (shown, not run) blocks are allowed, so that all is tested"
            )
        n = end + 1
    return steps


def _commands(body: list[str], first_line: int) -> list[Command]:
    commands: list[Command] = []
    continued = False
    for offset, line in enumerate(body):
        if continued:
            commands[-1].text += "\n" + line  # bash reads backslash-newline as a continuation
        elif line.startswith("$ "):
            commands.append(Command(first_line + offset, line[2:]))
        elif not commands:
            raise TutorialError(f"line {first_line + offset}: console block not starting with $")
        else:
            commands[-1].expected.append(line)
        continued = line.endswith("\\") and commands[-1].expected == []
    return commands


def normalise(text: str) -> list[str]:
    lines = [DURATION.sub("in <duration>", TIME.sub("<time>", line)).rstrip() for line in text]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def matches(expected: list[str], actual: list[str]) -> bool:
    """Every line equal, where a line ``...`` of ``expected`` stands for any lines."""
    pattern = "".join(
        r"(?:.*\n)*?" if line == "..." else re.escape(line) + r"\n" for line in expected
    )
    return re.fullmatch(pattern, "".join(line + "\n" for line in actual)) is not None


@dataclass
class Substitution:
    """A command of the page that sets up the reader's machine, and what the test does instead."""

    pattern: re.Pattern[str]
    why: str
    check: Callable[[Run, Command], None]
    used: int = 0


@dataclass
class Result:
    command: Command
    ran: str  # the command as run, or what replaced it
    returncode: int
    output: list[str]


@dataclass
class Run:
    """One run of the page in ``workdir``."""

    workdir: Path
    queue: str
    broker: str = PAGE_BROKER
    timeout: float = 120.0
    results: list[Result] = field(default_factory=list)
    #: How many times the queue and the broker URL were replaced in commands and files.
    replaced: dict[str, int] = field(
        default_factory=lambda: {"queue": 0, "broker": 0, "queue in files": 0}
    )

    def __post_init__(self) -> None:
        self.cwd = self.workdir
        self.queue_2 = self.queue.replace(PAGE_QUEUE, PAGE_QUEUE_2, 1)
        self.env = {
            "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
            "VIRTUAL_ENV": str(VENV),
            "HOME": os.environ.get("HOME", str(self.workdir)),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "TMPDIR": os.environ.get("TMPDIR", tempfile.gettempdir()),
        }
        self.substitutions = [
            Substitution(
                re.compile(r"^python3? -m venv \S+$"),
                "the test runs in this checkout's virtualenv, first on PATH",
                _nothing,
            ),
            Substitution(
                re.compile(r"^(\.|source) \S+/bin/activate$"),
                "the test runs in this checkout's virtualenv, first on PATH",
                _nothing,
            ),
            Substitution(
                re.compile(r"^pip install [\"']?django-transactional-inbox(\[\w+\])?[\"']?$"),
                "the shared virtualenv must not change: check django_inbox is this checkout's",
                _imports_this_checkout,
            ),
            Substitution(
                re.compile(r"^docker run .*rabbitmq"),
                "the test uses the RabbitMQ that runs: check that it answers",
                _broker_answers,
            ),
        ]

    # -- the page's text, adapted -------------------------------------------------------

    @property
    def queues(self) -> dict[str, str]:
        """The page's queue names and this run's."""
        return {PAGE_QUEUE: self.queue, PAGE_QUEUE_2: self.queue_2}

    def adapt_command(self, text: str) -> str:
        for page, ours in self.queues.items():
            text, count = re.subn(rf"--queue {page}(?=\s|$)", f"--queue {ours}", text)
            self.replaced["queue"] += count
        return self._broker(text)

    def adapt_file(self, content: str) -> str:
        for page, ours in self.queues.items():
            content, count = re.subn(rf"([\"']){page}\1", rf"\g<1>{ours}\1", content)
            self.replaced["queue in files"] += count
        return self._broker(content)

    def adapt_output(self, line: str) -> str:
        """What a command printed, with this run's queues and broker shown as the page's."""
        for page, ours in self.queues.items():
            line = re.sub(rf"'{re.escape(ours)}'", f"'{page}'", line)
        if self.broker != PAGE_BROKER:
            line = line.replace(_masked(self.broker), _masked(PAGE_BROKER))
        return line

    def _broker(self, text: str) -> str:
        if self.broker != PAGE_BROKER:
            self.replaced["broker"] += text.count(PAGE_BROKER)
            text = text.replace(PAGE_BROKER, self.broker)
        return text

    # -- steps ----------------------------------------------------------------------------

    def run(self, steps: list[Step], echo: Callable[[str], None] | None = None) -> None:
        for step in steps:
            if isinstance(step, FileBlock):
                self.write(step)
            else:
                result = self.execute(step)
                if echo:
                    echo(f"$ {step.text}\n" + "".join(f"{line}\n" for line in result.output))
                else:
                    self.verify(result)
        for substitution in self.substitutions:
            if substitution.used != 1:
                raise TutorialError(
                    f"the page has {substitution.used} command(s) matching "
                    f"{substitution.pattern.pattern!r}, the test expects one "
                    f"({substitution.why}): update tests/tutorial_support/tutorial.py"
                )

    def write(self, block: FileBlock) -> None:
        path = (self.cwd / block.path).resolve()
        if not path.is_relative_to(self.workdir):
            raise TutorialError(f"line {block.line}: {block.path} is outside the tutorial")
        if not path.parent.is_dir():
            raise TutorialError(
                f"line {block.line}: {path.parent.relative_to(self.workdir)}/ does not exist "
                f"when the page asks for {block.path}: a command must create it first"
            )
        content = self.adapt_file(block.content)
        if block.append:
            if not path.exists():
                raise TutorialError(f"line {block.line}: appending to a missing {block.path}")
            with path.open("a") as out:
                out.write("\n" + content)
        else:
            path.write_text(content)

    def execute(self, command: Command) -> Result:
        for substitution in self.substitutions:
            if substitution.pattern.search(command.text):
                substitution.used += 1
                if command.expected:
                    raise TutorialError(
                        f"line {command.line}: the page shows output for {command.text!r}, "
                        "which the test replaces and so cannot check"
                    )
                substitution.check(self, command)
                result = Result(command, f"(replaced: {substitution.why})", 0, [])
                self.results.append(result)
                return result
        cd = re.fullmatch(r"cd (\S+)", command.text)
        if cd:
            target = (self.cwd / cd[1]).resolve()
            if not target.is_dir() or not target.is_relative_to(self.workdir):
                raise TutorialError(f"line {command.line}: cannot cd to {cd[1]}")
            self.cwd = target
            result = Result(command, command.text, 0, [])
            self.results.append(result)
            return result
        text = self.adapt_command(command.text)
        try:
            proc = subprocess.run(
                ["bash", "-c", text],
                cwd=self.cwd,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=self.timeout,
            )
        except subprocess.TimeoutExpired as exc:
            raise TutorialError(
                f"line {command.line}: {text!r} ran for more than {self.timeout:.0f}s; "
                f"output so far:\n{exc.output}"
            ) from None
        output = [self.adapt_output(line) for line in proc.stdout.splitlines()]
        if proc.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
            output = [line for line in output if not BASH_KILLED.match(line)] + ["Killed"]
        result = Result(command, text, proc.returncode, output)
        self.results.append(result)
        return result

    def verify(self, result: Result) -> None:
        command, code = result.command, result.returncode
        expected, actual = normalise(command.expected), normalise(result.output)
        where = f"line {command.line}: $ {result.ran}"
        shown = "\n".join(f"    {line}" for line in result.output) or "    (nothing)"
        if expected[-1:] == ["Killed"]:
            if code not in (-signal.SIGKILL, 128 + signal.SIGKILL):
                raise TutorialError(
                    f"{where}\nthe page says it is killed; it exited {code}:\n{shown}"
                )
        elif any(line.startswith("CommandError:") for line in expected):
            if code in (0, -signal.SIGKILL, 128 + signal.SIGKILL):
                raise TutorialError(f"{where}\nthe page shows an error; it exited {code}:\n{shown}")
        elif code != 0:
            raise TutorialError(f"{where}\nexited {code}:\n{shown}")
        if not matches(expected, actual):
            wanted = "\n".join(f"    {line}" for line in command.expected) or "    (nothing)"
            raise TutorialError(f"{where}\nthe page shows:\n{wanted}\nit printed:\n{shown}")


def _masked(url: str) -> str:
    from kombu import Connection

    return str(Connection(url).as_uri())


def _nothing(run: Run, command: Command) -> None:
    pass


def _imports_this_checkout(run: Run, command: Command) -> None:
    proc = subprocess.run(
        ["python", "-c", "import django_inbox, kombu; print(django_inbox.__file__)"],
        cwd=run.cwd,
        env=run.env,
        capture_output=True,
        text=True,
        timeout=run.timeout,
    )
    where = Path(proc.stdout.strip()).resolve()
    if proc.returncode != 0 or not where.is_relative_to(ROOT):
        raise TutorialError(
            f"line {command.line}: instead of {command.text!r}, django_inbox must import from "
            f"{ROOT}: {proc.stdout}{proc.stderr}"
        )


def _broker_answers(run: Run, command: Command) -> None:
    problem = broker_problem(run.broker)
    if problem:
        raise TutorialError(f"line {command.line}: instead of {command.text!r}: {problem}")


def broker_problem(url: str) -> str | None:
    """Why the broker at ``url`` cannot be used, or None when it answers."""
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=5) as connection:
            connection.ensure_connection(max_retries=1)
    except Exception as exc:
        return f"RabbitMQ at {url} is unreachable: {type(exc).__name__}: {exc}"
    return None


def delete_queue(url: str, queue: str) -> None:
    from kombu import Connection, Queue

    with Connection(url, connect_timeout=5) as connection:
        Queue(queue, routing_key=queue, durable=True)(connection.default_channel).delete()


def delete_queues(run: Run) -> None:
    for queue in run.queues.values():
        delete_queue(run.broker, queue)


def read_pages() -> list[Step]:
    """Part 1 and part 2, as one page (part 2 continues in part 1's project)."""
    return [step for page in PAGES for step in parse(page.read_text())]


def new_queue() -> str:
    return f"tutorial-{PAGE_QUEUE}-{uuid.uuid4().hex[:10]}"


def main() -> None:
    """Run the page and print what each command printed (no comparison)."""
    broker = os.environ.get("INBOX_TEST_RABBITMQ", PAGE_BROKER)
    with tempfile.TemporaryDirectory(prefix="tutorial-") as workdir:
        run = Run(Path(workdir).resolve(), new_queue(), broker)
        try:
            run.run(read_pages(), echo=lambda text: print(text, end=""))
        finally:
            delete_queues(run)


if __name__ == "__main__":
    main()
