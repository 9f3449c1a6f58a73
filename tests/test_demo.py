"""The README's demo, run small: its own checks against the business tables must pass."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_stream_ends_with_every_check_ok() -> None:
    out = StringIO()
    call_command("inbox_demo", messages=300, seed=3, stdout=out)
    text = out.getvalue()
    print(text)
    assert "MISMATCH" not in text
    assert text.count(": OK") == 2
    assert "doubled charges 0, lost 0" in text
    assert "still pending                                    0           0" in text
