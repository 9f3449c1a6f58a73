"""What a new user's typo or missing step gets: a sentence and exit 2, never a silent success.

(``inbox_consume``'s own guardrails are in ``test_consume_hostile.py``; ``inbox_replay``'s
required selection in ``test_replay.py``; ``deliver()`` to an unknown consumer in
``test_hostile_input.py``.)
"""

from __future__ import annotations

import re
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


@pytest.mark.parametrize(
    "args",
    [
        ("inbox_process", "--batch-size", "9223372036854775808"),
        ("inbox_process", "--metrics-port", "99999"),
        ("inbox_process", "--max-messages", "0"),
        ("inbox_consume", "--consumer", "stream", "--queue", "q", "--prefetch", "70000"),
        ("inbox_consume", "--consumer", "stream", "--queue", "q", "--commit-every", "100001"),
        ("inbox_reclaim", "--batch-size", "0"),
        ("inbox_purge", "--older-than", "1d", "--batch-size", "100001"),
    ],
    ids=" ".join,
)
def test_numbers_out_of_range_are_refused_as_they_are_parsed(args: tuple[str, ...]) -> None:
    """A batch size past a bigint failed in a query (DataError), a prefetch past 65,535 in
    AMQP (struct.error), a port past 65,535 at bind: tracebacks, exit 1."""
    with pytest.raises(CommandError, match="is not an integer from"):
        call_command(*args)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("outbox_relay", "--broker", "amqp://g:g@127.0.0.1:notaport//"), "cannot be read"),
        (("outbox_relay", "--broker", "amqp://[::1"), "cannot be read"),
        (("inbox_consume", "--consumer", "stream", "--queue", "q",
          "--broker", "amqp://g:g@127.0.0.1:notaport//"), "cannot be read"),  # not "scheme"
        (("inbox_consume", "--consumer", "stream", "--queue", "", "--broker", "memory://"),
         "--queue is empty"),  # a broker names it: a durable queue was left on every run
        (("inbox_consume", "--consumer", "stream", "--queue", "q" * 256, "--broker", "memory://"),
         "--queue is over 255 bytes"),
        (("inbox_consume", "--consumer", "stream", "--queue", "q", "--exchange", "é" * 128,
          "--broker", "memory://"), "--exchange is over 255 bytes"),
        (("inbox_show", "\udcff"), "is not UTF-8 text"),
        (("inbox_replay", "--message-id", "\udcff"), "is not UTF-8 text"),
        (("inbox_replay", "--key", "a\x00b"), "holds a NUL character"),
        (("inbox_replay", "--all", "--wait"), "--wait follows a re-run"),
        (("inbox_replay", "--since", "1h", "--until", "2h"), "--since is not before --until"),
        (("inbox_consume", "--consumer", "stream", "--queue", "q", "--ack", "after-store",
          "--commit-every", "5", "--broker", "memory://"), "goes with --ack after-process"),
        (("inbox_consume", "--consumer", "stream", "--queue", "q", "--broker", ""),
         "--broker is empty"),
        (("outbox_relay", "--broker", " "), "--broker is empty"),
        (("inbox_consume", "--consumer", "stream", "--queue", "s",
          "--broker", "nats://127.0.0.1:notaport"), "nats:// broker URL in --broker"),
        (("inbox_consume", "--consumer", "stream", "--queue", "s", "--broker", "nats://"),
         "names no host"),
        (("inbox_consume", "--consumer", "stream", "--queue", "s", "--exchange", "x",
          "--broker", "nats://127.0.0.1:4222"), "a nats:// broker has none"),
        (("inbox_consume", "--consumer", "stream", "--queue", "s",
          "--broker", "nosuch://127.0.0.1"), "redis+streams://, nats://"),
        (("inbox_purge", "--outbox", "--older-than", "1d", "--pause", "5s"),
         "it takes --older-than and --batch-size"),
    ],
)  # fmt: skip
@pytest.mark.django_db
def test_arguments_no_broker_or_query_can_take_are_refused_at_once(
    args: tuple[str, ...], says: str
) -> None:
    """Each ended in a traceback (a ValueError of the URL parser, a struct.error of AMQP, a
    UnicodeEncodeError of the driver), or left a queue behind."""
    with pytest.raises(CommandError, match=re.escape(says)):
        call_command(*args)
