"""What a new user's typo or missing step gets: a sentence and exit 2, never a silent success.

(``inbox_consume``'s own guardrails are in ``test_consume_hostile.py``; ``inbox_replay``'s
required selection in ``test_replay.py``; ``deliver()`` to an unknown consumer in
``test_hostile_input.py``.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_inbox import store

Manage = Callable[..., subprocess.Popen[str]]


@pytest.mark.django_db
def test_stats_for_an_unknown_consumer_exits_2_naming_the_known_ones() -> None:
    with pytest.raises(CommandError) as info:
        call_command("inbox_stats", "--consumer", "invnetory", stdout=StringIO())

    assert info.value.returncode == 2
    assert "unknown consumer 'invnetory'" in str(info.value)
    assert "'inventory'" in str(info.value)


@pytest.mark.django_db
def test_stats_for_a_consumer_known_only_by_its_rows_is_fine() -> None:
    from django_inbox import store_dead

    store_dead(consumer="retired", message_id="r-1", event_type="x", payload={}, reason="gone")
    out = StringIO()

    with pytest.raises(CommandError) as info:  # a dead row: exit 1, the problems code
        call_command("inbox_stats", "--consumer", "retired", stdout=out)

    assert info.value.returncode == 1
    assert "retired" in out.getvalue()


@pytest.mark.django_db
def test_stats_for_a_known_consumer_without_rows_is_healthy() -> None:
    out = StringIO()
    call_command("inbox_stats", "--consumer", "inventory", stdout=out)
    assert "healthy" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_store_then_stats_still_counts_rows() -> None:
    assert store(consumer="effects", message_id="g-1", event_type="effect.write", payload={})
    out = StringIO()
    call_command("inbox_stats", "--consumer", "effects", "--json", stdout=out)
    assert '"received": 1' in out.getvalue()
