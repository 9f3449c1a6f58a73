"""Entry points for the real processes the crash and concurrency tests start.

Run as ``python -m tests.procs deliver CONSUMER MESSAGE_ID PAYLOAD_JSON`` (prints the
outcome), or used as ``multiprocessing`` targets (spawned, so each child sets Django up
from the environment it inherits).
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


def main(argv: list[str]) -> None:
    setup()
    from django_inbox import deliver

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
