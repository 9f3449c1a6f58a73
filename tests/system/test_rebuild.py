"""A rebuild of an ordered projection by re-running its completed messages, with real
``inbox_process`` workers and the real ``inbox_replay --force --wait``, while new versions of
the same keys keep arriving.

The projection (``effects.Projection``) folds each key's versions in order into a value that
depends on that order; each run also makes a side effect (a line in a file, outside the
database). At the end the rebuilt projection must equal a fresh fold of every version, in
order, and the file must hold exactly one line per message: the re-runs suppressed theirs.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import transaction
from effects.inbox_handlers import MODULUS
from effects.models import Projection

from django_inbox import store
from django_inbox.models import InboxKey, InboxMessage
from tests.system.test_consume import finish

pytestmark = [pytest.mark.postgres, pytest.mark.slow]
Manage = Callable[..., subprocess.Popen[str]]
Status = InboxMessage.Status
CONSUMER = "projection"
KEYS, FIRST, LATER = 20, 500, 30  # 10,000 messages built, then rebuilt; 600 arrive meanwhile


def n_of(key: int, sequence: int) -> int:
    return (key * 7919 + sequence * 104729) % 1_000_003


def put(key: int, sequence: int) -> None:
    store(
        consumer=CONSUMER, message_id=f"p{key:02d}-{sequence}", event_type="projection.apply",
        payload={"n": n_of(key, sequence)}, key=f"key-{key:02d}", sequence=sequence,
    )  # fmt: skip


def fresh_fold(key: int, last: int) -> int:
    value = 0
    for sequence in range(1, last + 1):
        value = (value * 31 + n_of(key, sequence)) % MODULUS
    return value


def side_effects(path: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in path.read_text().splitlines() if line)


def workers(manage: Manage, path: Path, n: int, idle: str) -> list[subprocess.Popen[str]]:
    return [
        manage(
            "inbox_process",
            "--consumer",
            CONSUMER,
            "--poll-interval",
            "0.05",
            "--until-idle",
            idle,
            env={"SIDE_EFFECTS_FILE": str(path)},
        )
        for _ in range(n)
    ]


def test_a_rebuild_under_new_traffic_ends_as_a_fresh_build_without_repeating_side_effects(
    manage: Manage, tmp_path: Path
) -> None:
    first_run, rebuild = tmp_path / "first.txt", tmp_path / "rebuild.txt"
    first_run.touch()
    rebuild.touch()
    for sequence in range(1, FIRST + 1):
        with transaction.atomic():
            for key in range(KEYS):
                put(key, sequence)
    started = time.monotonic()
    for proc in workers(manage, first_run, 2, "3"):
        finish(proc)
    built = time.monotonic() - started
    assert side_effects(first_run) == Counter(
        f"p{key:02d}-{sequence}" for key in range(KEYS) for sequence in range(1, FIRST + 1)
    )
    for key in range(KEYS):
        found = Projection.objects.get(key=f"key-{key:02d}")
        assert (found.version, found.value) == (FIRST, fresh_fold(key, FIRST))

    running = workers(manage, rebuild, 2, "5")
    replay = manage(
        "inbox_replay", "--consumer", CONSUMER, "--status", "completed", "--force",
        "--reason", "rebuild the projection", "--no-input", "--wait",
    )  # fmt: skip
    for sequence in range(FIRST + 1, FIRST + LATER + 1):  # new versions keep arriving
        for key in range(KEYS):
            put(key, sequence)
        time.sleep(0.05)
    replayed = finish(replay, timeout=600)
    outputs = [finish(proc, timeout=600) for proc in running]
    print(f"first build of {KEYS * FIRST:,} in {built:.1f}s; rebuild: {replayed!r}; {outputs}")

    assert "side effects of re-runs are suppressed" in replayed
    progress = [line.split()[1:4] for line in replayed.splitlines() if line.startswith("re-run ")]
    done, _, total = progress[-1]
    assert done == total and int(total.replace(",", "")) >= KEYS * FIRST, replayed
    rows = InboxMessage.objects.filter(consumer=CONSUMER)
    assert set(rows.values_list("status", flat=True)) == {Status.COMPLETED}
    assert rows.filter(rerun=True).count() >= KEYS * FIRST
    last = FIRST + LATER
    for key in range(KEYS):
        name = f"key-{key:02d}"
        found = Projection.objects.get(key=name)
        # Identical to a fresh fold of every version in order: nothing run out of order,
        # twice, or not at all (the handler also refuses to go backwards).
        assert (found.version, found.value) == (last, fresh_fold(key, last)), name
        assert found.reruns >= FIRST, name
        assert InboxKey.objects.get(consumer=CONSUMER, key=name).applied_sequence == last
    # The re-runs made no side effect; each new version made its own, once.
    made = side_effects(rebuild)
    assert made == Counter(
        f"p{key:02d}-{sequence}" for key in range(KEYS) for sequence in range(FIRST + 1, last + 1)
    )
    assert side_effects(first_run) == Counter(
        f"p{key:02d}-{sequence}" for key in range(KEYS) for sequence in range(1, FIRST + 1)
    )
