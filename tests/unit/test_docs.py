"""The reference documents everything users can name: settings, command options, public
functions and exceptions, check ids. A new one without an entry fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.core.management import load_command_class
from django.core.management.base import BaseCommand

import django_inbox
from django_inbox import services
from django_inbox.conf import DEFAULTS, POLICY_KEYS
from tests.conftest import ROOT

REFERENCE = ROOT / "docs" / "reference"
COMMANDS = [
    "inbox_consume",
    "inbox_process",
    "inbox_reclaim",
    "inbox_purge",
    "inbox_replay",
    "inbox_stats",
    "inbox_show",
    "outbox_relay",
]


def read(name: str) -> str:
    return (REFERENCE / name).read_text()


def section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(heading)}\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"no '## {heading}' section"
    return match.group(1)


@pytest.mark.parametrize("setting", sorted(DEFAULTS))
def test_every_setting_has_a_reference_entry(setting: str) -> None:
    assert re.search(rf"^### {setting}\s*$", read("settings.md"), re.M), setting


@pytest.mark.parametrize("key", sorted(POLICY_KEYS))
def test_every_consumer_policy_key_is_documented(key: str) -> None:
    assert f"`{key}`" in read("settings.md"), key


def _options(command: str) -> list[str]:
    app = "django_inbox.outbox" if command == "outbox_relay" else "django_inbox"
    cmd = load_command_class(app, command)
    parser = cmd.create_parser("manage.py", command)
    base = BaseCommand().create_parser("manage.py", "base")
    inherited = {o for action in base._actions for o in action.option_strings}
    return sorted(
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option not in inherited
    )


@pytest.mark.parametrize(
    ("command", "option"),
    [(command, option) for command in COMMANDS for option in _options(command)],
)
def test_every_command_option_is_documented(command: str, option: str) -> None:
    assert f"`{option}" in section(read("commands.md"), command), f"{command} {option}"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_documents_its_exit_codes(command: str) -> None:
    assert "Exit code" in section(read("commands.md"), command) or "exit code" in section(
        read("commands.md"), command
    )


@pytest.mark.parametrize(
    "name", sorted(set(django_inbox.__all__) | {f"services.{n}" for n in services.__all__})
)
def test_every_public_name_is_in_the_api_reference(name: str) -> None:
    short = re.escape(name.rpartition(".")[2])
    text = read("api.md")
    assert re.search(rf"`{short}\b", text) or re.search(rf"^#+ {short}\s*$", text, re.M), name


def test_every_check_id_is_documented() -> None:
    source = (Path(django_inbox.__file__).parent / "checks.py").read_text()
    ids = sorted(set(re.findall(r'"django_inbox\.([EW]\d{3})"', source)))
    assert ids, "no check ids found"
    text = read("checks.md")
    missing = [check for check in ids if not re.search(rf"^### {check}\s*$", text, re.M)]
    assert not missing, missing
