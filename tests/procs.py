"""Entry points for the real processes the crash and concurrency tests start.

Run as ``python -m tests.procs deliver CONSUMER MESSAGE_ID PAYLOAD_JSON`` (prints the
outcome), ``python -m tests.procs publish QUEUE COMMITS ROLLBACK_EVERY PACE`` (the outbox's
publisher: see :func:`publish_transactions`), ``python -m tests.procs relay-dies-after-confirm
BROKER`` (:func:`relay_dies_after_confirm`), or used as ``multiprocessing`` targets (spawned,
so each child sets Django up from the environment it inherits).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from typing import Any


def setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
    import django

    django.setup()


def deliver_rounds(barrier: Any, results: Any, rounds: int, prefix: str, consumer: str) -> None:
    """Deliver ``prefix-<round>`` once per round, all processes released together."""
    setup()
    from django.db import close_old_connections

    from django_inbox import deliver

    outcomes: list[str] = []
    errors: list[str] = []
    for n in range(rounds):
        barrier.wait(timeout=60)
        try:
            outcome = deliver(
                consumer=consumer,
                message_id=f"{prefix}-{n}",
                event_type="effect.write",
                payload={"round": n},
            )
            outcomes.append(outcome.value)
        except Exception:
            errors.append(traceback.format_exc())
            outcomes.append("error")
    close_old_connections()
    results.put((os.getpid(), outcomes, errors))


def publish_transactions(
    queue: str, commits: int, rollback_every: int, pace: float, through_outages: bool = False
) -> None:
    """Commit business transactions that publish ``commits`` messages in all (keys k0 … k4, in
    turn; every third transaction publishes two of its key, the second held behind the first
    of its own transaction), and roll back one more after every ``rollback_every`` messages;
    print one line per message: ``commit <message id> <key>`` (in the order published) or
    ``rollback <message id>``. With ``through_outages``, a transaction the database's outage
    broke is tried again, as an application's client would (one whose commit's answer was
    lost may have committed: its id is then not printed, and its effect is not counted)."""
    import time

    from django.db import Error, connection, transaction

    from django_inbox.outbox import publish

    class RolledBack(Exception):
        pass

    def committed(key: str, count: int) -> list[str]:
        for _ in range(600):
            try:
                with transaction.atomic():
                    return [
                        publish("effect.write", {"n": written + n}, routing_key=queue, key=key)
                        for n in range(count)
                    ]
            except Error:  # DatabaseError, and InterfaceError for a connection found closed
                if not through_outages:
                    raise
                connection.close()
                time.sleep(0.1)
        raise RuntimeError("the database did not come back")

    written = transactions = 0
    while written < commits:
        key = f"k{transactions % 5}"
        count = min(2 if transactions % 3 == 0 else 1, commits - written)
        ids = committed(key, count)
        for message_id in ids:
            print(f"commit {message_id} {key}", flush=True)
        transactions += 1
        for _ in ids:
            written += 1
            if written % rollback_every:
                continue
            try:
                with transaction.atomic():
                    lost = publish("effect.write", {"rolled_back": written}, routing_key=queue)
                    print(f"rollback {lost}", flush=True)
                    raise RolledBack
            except RolledBack:
                pass
        time.sleep(pace)


def relay_dies_after_confirm(broker: str) -> None:
    """Run a relay that SIGKILLs itself once the broker confirmed its first batch, before the
    rows are marked sent: the crash window between the confirm and the mark."""
    import signal

    from django_inbox.outbox import relay, rows

    def die(*args: Any, **kwargs: Any) -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    rows.mark_sent = die  # type: ignore[assignment]
    relay.rows.mark_sent = die  # type: ignore[attr-defined]
    relay.Relay(broker, until_idle=5).run()


def main(argv: list[str]) -> None:
    setup()
    from django_inbox import deliver

    if argv[0] == "relay-dies-after-confirm":
        relay_dies_after_confirm(argv[1])
        return
    if argv[0] == "publish":
        queue, commits, rollback_every, pace = argv[1:5]
        through = "--through-outages" in argv[5:]
        publish_transactions(queue, int(commits), int(rollback_every), float(pace), through)
        return
    command, consumer, message_id, payload = argv
    assert command == "deliver"
    outcome = deliver(
        consumer=consumer,
        message_id=message_id,
        event_type="effect.write",
        payload=json.loads(payload),
    )
    print(outcome.value, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
