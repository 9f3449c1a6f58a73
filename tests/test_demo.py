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
