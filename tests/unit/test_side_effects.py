"""``django_inbox.side_effects``: re-runs of completed messages (``message.is_rerun``),
``@side_effect`` and the consumer's ``side_effects_on_rerun`` policy. (Was ``test_reruns.py``;
ordered consumers' keys re-run in sequence order moved to ``test_services_rerun.py``.)"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import override_settings
from effects import inbox_handlers
from effects.models import Effect, Projection

from django_inbox import Outcome, deliver, side_effect, signals, store
from django_inbox.checks import check_settings
from django_inbox.models import InboxMessage
from django_inbox.ordered.gaps import park_expired_gaps
from django_inbox.processing.worker import Worker
from django_inbox.services import operator, select
from tests.conftest import handler
from tests.ordered import drain, sent_cleared  # noqa: F401  (autouse)

pytestmark = pytest.mark.django_db(transaction=True)
Status = InboxMessage.Status
ACTOR = {"actor": "alice (test)", "reason": "the receipts template was wrong"}


def notify(consumer: str, message_id: str, **payload: Any) -> Outcome:
    return deliver(
        consumer=consumer, message_id=message_id, event_type="effect.notify", payload=payload
    )


def rerun(consumer: str, *message_ids: str, **options: Any) -> operator.ActionResult:
    rows = select(consumer=consumer, message_ids=list(message_ids), statuses=["completed"])
    return operator.replay(rows, force=True, **{**ACTOR, **options})


def effects(consumer: str, message_id: str) -> list[tuple[int, bool]]:
    found = Effect.objects.filter(consumer=consumer, message_id=message_id).order_by("id")
    return list(found.values_list("attempt", "rerun"))


def test_a_first_run_makes_its_side_effects_and_is_not_a_rerun() -> None:
    assert notify("notify", "m1") == Outcome.PROCESSED
    assert effects("notify", "m1") == [(1, False)]
    assert inbox_handlers.SENT == ["m1", "async:m1"]
    assert InboxMessage.objects.get(message_id="m1").is_rerun is False


def test_a_forced_rerun_of_a_suppressing_consumer_skips_side_effects_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        heard.append(kwargs)

    signals.side_effect_suppressed.connect(receiver)
    try:
        notify("notify", "m1", secret="do-not-log-me")
        inbox_handlers.SENT.clear()
        result = rerun("notify", "m1")
        assert result.changed == {"completed": 1}
        row = InboxMessage.objects.get(message_id="m1")
        assert (row.status, row.is_rerun) == (Status.RECEIVED, True)
        with caplog.at_level(logging.INFO, logger="django_inbox"):
            drain("notify")
    finally:
        signals.side_effect_suppressed.disconnect(receiver)
    # The handler ran again (its database write is there, marked as a re-run) ...
    assert effects("notify", "m1") == [(1, False), (1, True)]
    # ... and neither side effect ran: not the plain one, not the async one, both called from
    # a function the handler calls.
    assert inbox_handlers.SENT == []
    row = InboxMessage.objects.get(message_id="m1")
    assert row.status == Status.COMPLETED
    suppressed = [entry for entry in row.history if entry["kind"] == "suppressed"]
    assert [entry["function"] for entry in suppressed] == [
        "effects.inbox_handlers.send_receipt",
        "effects.notify_async",
    ]
    assert all(entry["attempt"] == 1 for entry in suppressed)
    lines = [r.getMessage() for r in caplog.records if "side effect" in r.getMessage()]
    assert len(lines) == 2 and "effects.inbox_handlers.send_receipt" in lines[0]
    assert not any("do-not-log-me" in r.getMessage() for r in caplog.records)
    assert [h["extra"]["function"] for h in heard] == [
        "effects.inbox_handlers.send_receipt",
        "effects.notify_async",
    ]
    assert {h["consumer"] for h in heard} == {"notify"} and heard[0]["message_id"] == "m1"


def test_a_forced_rerun_of_a_consumer_that_runs_side_effects_runs_them() -> None:
    notify("effects", "m1")
    inbox_handlers.SENT.clear()
    rerun("effects", "m1")
    drain("effects")
    assert effects("effects", "m1") == [(1, False), (1, True)]
    assert inbox_handlers.SENT == ["m1", "async:m1"]
    row = InboxMessage.objects.get(message_id="m1")
    assert not [entry for entry in row.history if entry["kind"] == "suppressed"]


def test_a_dead_letter_replay_is_not_a_rerun_and_makes_its_side_effects() -> None:
    assert notify("notify", "m1", reject="bad input") == Outcome.DEAD
    assert inbox_handlers.SENT == ["m1", "async:m1"]  # made, then the handler rejected it
    inbox_handlers.SENT.clear()
    row = InboxMessage.objects.get(message_id="m1")
    row.payload = {}
    row.save(update_fields=["payload"])
    result = operator.replay(select(message_ids=["m1"]), **ACTOR)
    assert result.changed == {"dead": 1}
    assert InboxMessage.objects.get(message_id="m1").is_rerun is False
    drain("notify")
    assert InboxMessage.objects.get(message_id="m1").status == Status.COMPLETED
    assert effects("notify", "m1") == [(1, False)]
    assert inbox_handlers.SENT == ["m1", "async:m1"]


def test_a_failing_rerun_records_what_it_suppressed_with_the_failure() -> None:
    notify("notify", "m1")
    row = InboxMessage.objects.get(message_id="m1")
    row.payload = {"fail_times": 1}  # the re-run's first attempt fails
    row.save(update_fields=["payload"])
    rerun("notify", "m1")
    Worker(["notify"], until_idle=1, poll_interval=0.01).run()  # past the retry's backoff
    row = InboxMessage.objects.get(message_id="m1")
    assert row.status == Status.COMPLETED and row.attempts == 2
    kinds = [(entry["kind"], entry.get("attempt")) for entry in row.history]
    assert kinds[-5:] == [
        ("suppressed", 1), ("suppressed", 1), ("error", 1), ("suppressed", 2), ("suppressed", 2),
    ]  # fmt: skip
    assert inbox_handlers.SENT == ["m1", "async:m1"]  # the first run's, none since


def test_side_effects_outside_handlers_and_outside_reruns_just_run() -> None:
    assert inbox_handlers.send_receipt("x") == "sent"
    assert asyncio.run(inbox_handlers.notify_async("y")) == "notified"
    assert inbox_handlers.SENT == ["x", "async:y"]

    @side_effect
    def plain(value: int) -> int:
        return value * 2

    assert plain(4) == 8 and plain.__name__ == "plain"
    assert plain.inbox_side_effect.endswith("plain")  # type: ignore[attr-defined]


def test_the_policy_is_checked_at_start_up() -> None:
    with override_settings(INBOX_CONSUMERS={"notify": {"side_effects_on_rerun": "supress"}}):
        errors = [e for e in check_settings() if e.id == "django_inbox.E017"]
    assert len(errors) == 1 and "'supress'" in errors[0].msg
    with override_settings(INBOX_SIDE_EFFECTS_ON_RERUN="never"):
        assert [e.id for e in check_settings()].count("django_inbox.E017") == 1
    with override_settings(INBOX_SIDE_EFFECTS_ON_RERUN="suppress"):
        assert "django_inbox.E017" not in [e.id for e in check_settings()]


def test_the_counter_counts_suppressed_calls_by_consumer_and_function() -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    from django_inbox.contrib import prometheus

    registry = prometheus_client.CollectorRegistry()
    prometheus.install(registry, gauges=False)
    notify("notify", "m1")
    rerun("notify", "m1")
    drain("notify")
    value = registry.get_sample_value(
        "inbox_side_effects_suppressed_total",
        {"consumer": "notify", "function": "effects.inbox_handlers.send_receipt"},
    )
    assert value == 1


def test_the_command_says_whether_side_effects_run_and_needs_a_reason(capsys: Any) -> None:
    notify("notify", "n1")
    notify("effects", "e1")
    with pytest.raises(CommandError, match="--reason"):
        call_command("inbox_replay", "--status", "completed", "--force", "--no-input")
    call_command(
        "inbox_replay", "--status", "completed", "--force", "--reason", "fix", "--dry-run",
        "--no-input",
    )  # fmt: skip
    out = capsys.readouterr().out
    assert "notify: side effects of re-runs would be suppressed" in out
    assert "effects.inbox_handlers.send_receipt" in out
    assert "effects: side effects of re-runs would be run again" in out
    assert InboxMessage.objects.filter(status=Status.COMPLETED).count() == 2  # a dry run


# --- ordered consumers: a key re-runs in sequence order ---------------------------------


def version(key: str, sequence: int, n: int) -> bool:
    return store(
        consumer="projection", message_id=f"{key}-{sequence}", event_type="projection.apply",
        payload={"n": n}, key=key, sequence=sequence,
    )  # fmt: skip


def projection(key: str) -> tuple[int, int, int]:
    found = Projection.objects.get(key=key)
    return found.value, found.version, found.reruns


def test_reruns_in_a_shared_transaction_record_each_suppression_once() -> None:
    for n in range(3):
        notify("notify", f"m{n}")
    row = InboxMessage.objects.get(message_id="m1")
    row.payload = {"fail_times": 1}  # fails in the batch, so the batch runs one by one
    row.save(update_fields=["payload"])
    inbox_handlers.SENT.clear()
    rerun("notify", "m0", "m1", "m2")
    Worker(["notify"], until_idle=1, poll_interval=0.01, commit_every=10).run()
    for n in range(3):
        row = InboxMessage.objects.get(message_id=f"m{n}")
        assert row.status == Status.COMPLETED, n
        suppressed = [
            (e["attempt"], e["function"]) for e in row.history if e["kind"] == "suppressed"
        ]
        attempts = [1, 2] if n == 1 else [1]
        expected = [(a, f) for a in attempts for f in
                    ("effects.inbox_handlers.send_receipt", "effects.notify_async")]  # fmt: skip
        assert suppressed == expected, (n, row.history)
    assert inbox_handlers.SENT == []


# --- what a red-team pass found ----------------------------------------------------------


def _on_commit_handler(message: Any) -> None:
    Effect.objects.create(consumer="notify", message_id=message.message_id, attempt=1, pid=0)
    transaction.on_commit(lambda: inbox_handlers.send_receipt(message.message_id))


def test_a_side_effect_sent_from_on_commit_is_suppressed_in_a_rerun_too() -> None:
    with handler("effect.on_commit", "notify", _on_commit_handler):
        deliver(consumer="notify", message_id="c1", event_type="effect.on_commit", payload={})
        assert inbox_handlers.SENT == ["c1"]
        inbox_handlers.SENT.clear()
        rerun("notify", "c1")
        drain("notify")
    assert inbox_handlers.SENT == []
    row = InboxMessage.objects.get(message_id="c1")
    assert row.status == Status.COMPLETED
    assert [(e["function"], e["calls"]) for e in row.history if e["kind"] == "suppressed"] == [
        ("effects.inbox_handlers.send_receipt", 1)
    ]


def _on_commit_after_another_writer(message: Any) -> None:
    """After the commit: another writer adds an entry to the row's history first (what an
    operator's action or a concurrent process may do at that moment), then a suppressed
    side effect is recorded."""
    from django_inbox import history

    def another_writer() -> None:
        found = InboxMessage.objects.get(pk=message.pk)
        said = f"meanwhile, re-run: {message.is_rerun}"
        entry = {"kind": "note", "at": "2026-01-01T00:00:00+00:00", "message": said}
        InboxMessage.objects.filter(pk=message.pk).update(
            history=history.append(found.history, entry)
        )

    transaction.on_commit(another_writer)
    transaction.on_commit(lambda: inbox_handlers.send_receipt(message.message_id))


def test_a_suppression_recorded_after_the_commit_keeps_entries_written_meanwhile() -> None:
    """The suppressions of on_commit callbacks were written back as the whole history held in
    memory, by primary key: an entry another writer added after the commit was lost."""
    with handler("effect.on_commit", "notify", _on_commit_after_another_writer):
        deliver(consumer="notify", message_id="c2", event_type="effect.on_commit", payload={})
        rerun("notify", "c2")
        drain("notify")
    entries = InboxMessage.objects.get(message_id="c2").history
    said = [e["message"] if e["kind"] == "note" else e["kind"] for e in entries]
    said = [text for text in said if text.startswith("meanwhile") or text == "suppressed"]
    assert said == ["meanwhile, re-run: False", "meanwhile, re-run: True", "suppressed"], said


def _hand_on(message: Any) -> None:
    deliver(
        consumer="effects", message_id=f"derived-of-{message.attempts}-{message.is_rerun}",
        event_type="effect.notify", payload={},
    )  # fmt: skip


def test_a_first_run_inside_a_reruns_handler_makes_its_side_effects() -> None:
    with handler("effect.hand_on", "notify", _hand_on):
        deliver(consumer="notify", message_id="outer", event_type="effect.hand_on", payload={})
        inbox_handlers.SENT.clear()
        rerun("notify", "outer")
        drain("notify")
    inner = InboxMessage.objects.get(consumer="effects", message_id="derived-of-1-True")
    assert inner.status == Status.COMPLETED and not inner.is_rerun
    assert inbox_handlers.SENT == ["derived-of-1-True", "async:derived-of-1-True"]
    outer = InboxMessage.objects.get(message_id="outer")
    assert not [e for e in outer.history if e["kind"] == "suppressed"]


@side_effect
def _lines(n: int) -> Any:
    yield from range(n)


@side_effect
async def _async_lines(n: int) -> Any:
    for i in range(n):
        yield i


def _iterate(message: Any) -> None:
    async def collect() -> list[int]:
        return [i async for i in _async_lines(2)]

    assert list(_lines(3)) == ([] if message.is_rerun else [0, 1, 2])
    assert asyncio.run(collect()) == ([] if message.is_rerun else [0, 1])


def test_generator_side_effects_give_nothing_to_iterate_when_suppressed() -> None:
    with handler("effect.iterate", "notify", _iterate):
        deliver(consumer="notify", message_id="g1", event_type="effect.iterate", payload={})
        rerun("notify", "g1")
        drain("notify")
    row = InboxMessage.objects.get(message_id="g1")
    assert row.status == Status.COMPLETED, row.last_error
    assert sorted(
        e["function"].rsplit(".", 1)[-1] for e in row.history if e["kind"] == "suppressed"
    ) == ["_async_lines", "_lines"]


def _many(message: Any) -> None:
    for n in range(150):
        inbox_handlers.send_receipt(f"{message.message_id}-{n}")


def test_many_suppressed_calls_make_one_entry_and_keep_the_operators_entry() -> None:
    with handler("effect.many", "notify", _many):
        deliver(consumer="notify", message_id="h1", event_type="effect.many", payload={})
        rerun("notify", "h1")
        drain("notify")
    row = InboxMessage.objects.get(message_id="h1")
    kinds = [e["kind"] for e in row.history]
    assert kinds == ["replay", "suppressed"]
    assert row.history[1]["calls"] == 150 and row.history[0]["reason"] == ACTOR["reason"]


def test_a_version_completing_while_its_key_is_selected_again_is_never_replayed_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django_inbox.services import rerun as reruns

    for sequence in (1, 2, 3):
        version("A", sequence, sequence)
    drain("projection")
    operator.replay(
        select(consumer="projection", message_ids=["A-1"], statuses=["completed"]),
        force=True,
        **ACTOR,
    )
    real_split = reruns.split

    def split_then_a_worker_commits(rows: Any) -> Any:
        parts = real_split(rows)
        Worker(["projection"], max_messages=1, until_idle=0, poll_interval=0.01).run()
        return parts

    monkeypatch.setattr(reruns, "split", split_then_a_worker_commits)
    operator.replay(select(consumer="projection", message_ids=["A-1"]), force=True, **ACTOR)
    monkeypatch.undo()
    drain("projection")
    statuses = dict(InboxMessage.objects.filter(key="A").values_list("sequence", "status"))
    assert statuses == {1: "completed", 2: "completed", 3: "completed"}
    assert projection("A")[1] == 3


def test_wait_exits_1_when_a_rerun_version_goes_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    from django_inbox.management import following

    for sequence in (1, 2, 3):
        version("A", sequence, sequence)
    drain("projection")
    row = InboxMessage.objects.get(message_id="A-2")
    row.payload = {"n": 2, "reject": "the fixed handler rejects it"}
    row.save(update_fields=["payload"])
    polls: list[int] = []

    def sleep(_: float) -> None:  # the command's poll: the workers run meanwhile
        polls.append(1)
        assert len(polls) < 30, "inbox_replay --wait did not stop"
        drain("projection")

    monkeypatch.setattr(following.time, "sleep", sleep)  # --wait's poll
    with pytest.raises(CommandError, match=r"1 re-run row.* dead or parked; 1 wait behind"):
        call_command(
            "inbox_replay", "--consumer", "projection", "--key", "A", "--status", "completed",
            "--force", "--reason", "rebuild", "--wait", "--no-input",
        )  # fmt: skip
    statuses = dict(InboxMessage.objects.filter(key="A").values_list("sequence", "status"))
    assert statuses == {1: "completed", 2: "dead", 3: "waiting"}


def test_a_rerun_passes_the_gaps_its_first_run_was_replayed_past() -> None:
    consumers = {
        "projection": {"ordered": True, "side_effects_on_rerun": "suppress", "gap_timeout": 0.2}
    }
    with override_settings(INBOX_CONSUMERS=consumers):
        for sequence in (1, 2, 4, 5, 6):  # 3 never arrives
            version("A", sequence, sequence)
        drain("projection")
        time.sleep(0.3)
        park_expired_gaps()
        operator.replay(select(consumer="projection", statuses=["parked"]), **ACTOR)
        drain("projection")
        first = projection("A")
        assert first[1] == 6
        result = operator.replay(
            select(consumer="projection", keys=["A"], statuses=["completed"]), force=True, **ACTOR
        )
        assert any("sequence(s) 3 have no row" in said for said in result.notes)
        Worker(["projection"], until_idle=2.5, poll_interval=0.01).run()  # sweeps every second
    statuses = dict(InboxMessage.objects.filter(key="A").values_list("sequence", "status"))
    assert statuses == {n: "completed" for n in (1, 2, 4, 5, 6)}
    assert projection("A")[:2] == first[:2]
    assert any(
        e["kind"] == "past_gap" and "first run passed" in e["message"]
        for e in InboxMessage.objects.get(message_id="A-4").history
    )


def test_versions_completed_before_the_consumer_was_ordered_are_refused_with_a_reason() -> None:
    unordered = {"projection": {"ordered": False}}
    with override_settings(INBOX_CONSUMERS=unordered):
        for sequence in (1, 2):
            version("A", sequence, sequence)
        drain("projection")
    result = operator.replay(
        select(consumer="projection", statuses=["completed"]), force=True, **ACTOR
    )
    assert result.total == 0
    assert sum(n for why, n in result.refused.items() if "has not applied" in why) == 2


def test_inbox_show_prints_suppressions_and_the_inboxs_own_entries(capsys: Any) -> None:
    notify("notify", "m1")
    rerun("notify", "m1")
    drain("notify")
    call_command("inbox_show", "m1")
    out = capsys.readouterr().out
    assert "attempt 1: suppressed effects.inbox_handlers.send_receipt x1 (re-run)" in out
    assert "replay by alice (test) via python (was completed)" in out
    assert "by None" not in out
