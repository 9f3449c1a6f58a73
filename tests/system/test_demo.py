"""The README's demo, run small: its own checks against the business tables must pass."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import override_settings

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_stream_through_the_embedded_broker_ends_with_every_check_ok(
    tmp_path: Path,
) -> None:
    folders = {
        "data_folder_in": str(tmp_path / "messages"),
        "data_folder_out": str(tmp_path / "messages"),
        "control_folder": str(tmp_path / "control"),
    }
    out = StringIO()
    with override_settings(
        INBOX_BROKER_URL="filesystem://", INBOX_BROKER_TRANSPORT_OPTIONS=folders
    ):
        call_command("inbox_demo", messages=300, seed=3, stdout=out)
    text = out.getvalue()
    print(text)
    assert "MISMATCH" not in text
    assert text.count(": OK") == 2
    assert "doubled charges 0, lost 0" in text
    assert "refused at the broker (no message id)            1           1" in text
    assert "still pending                                    0           0" in text
    # Reasons are cut at a word, with an ellipsis; the worker's outcomes read as a sentence.
    reasons = text.split("Dead messages and why:")[1].split("Checks against")[0].splitlines()
    for line in filter(None, (line.strip() for line in reasons)):
        assert len(line) <= 110, line
        if line.endswith("…"):
            assert not line[-2].isspace() and line[:-1].rstrip() == line[:-1], line
    (worker,) = [line for line in text.splitlines() if "the worker ran" in line]
    assert "{" not in worker and "processed" in worker, worker


def test_demo_options_say_what_they_do() -> None:
    from shop.management.commands.inbox_demo import Command

    parser = Command().create_parser("manage.py", "inbox_demo")
    helps = {action.dest: action.help for action in parser._actions}
    assert helps["messages"] and helps["seed"]
