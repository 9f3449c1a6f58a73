"""Handlers for the crash tests. The payload tells each run how to misbehave:

``kill``: ``"always"`` SIGKILLs the worker after the write, every attempt;
``kill_file``: SIGKILL after the write only if that file exists (it is removed first, so
the next attempt survives); ``kill_after_commit_file``: the same, right after the commit;
``fail_always``: raise every attempt; ``fail_times``: raise on the first N attempts; ``sleep``
(seconds) on ``sleep_on_attempt``: hold the transaction open after the write; ``fail_text``:
raise with that text (``<NUL>`` in it becomes a NUL); ``terminate_backend``: ``"always"``
terminates the handler's own database connection (as a server restart would),
``terminate_backend_file`` only while that file exists (removed first);
``statement_timeout``: run a query that a statement timeout cancels.
"""

import os
import signal
import time

from asgiref.sync import async_to_sync
from django.db import connection, transaction

from django_inbox import Park, Reject, inbox_handler, side_effect

from .models import Effect, OrderedRun, Projection

#: Calls the side effects below made in this process (tests in this process read it).
SENT: list[str] = []
#: Folding a version into a projection: order-dependent, so an out-of-order rebuild shows.
MODULUS = 2**61 - 1


def _write(message, consumer):
    Effect.objects.create(
        consumer=consumer,
        message_id=message.message_id,
        attempt=message.attempts,
        pid=os.getpid(),
        rerun=message.is_rerun,
    )


@side_effect
def send_receipt(message_id: str) -> str:
    """An effect outside the database: a line in ``SIDE_EFFECTS_FILE`` (if set) and ``SENT``."""
    SENT.append(message_id)
    path = os.environ.get("SIDE_EFFECTS_FILE")
    if path:
        with open(path, "a") as lines:  # one short write per call: O_APPEND keeps it whole
            lines.write(f"{message_id} {os.getpid()}\n")
    return "sent"


@side_effect(name="effects.notify_async")
async def notify_async(message_id: str) -> str:
    SENT.append(f"async:{message_id}")
    return "notified"


def _tell_the_customer(message):
    """Code the handler calls, which calls the side effects (not the handler itself)."""
    send_receipt(message.message_id)
    async_to_sync(notify_async)(message.message_id)


def _misbehave(message):
    payload = message.payload if isinstance(message.payload, dict) else {}
    if payload.get("kill") == "always":
        os.kill(os.getpid(), signal.SIGKILL)
    kill_file = payload.get("kill_file")
    if kill_file and os.path.exists(kill_file):
        os.remove(kill_file)
        os.kill(os.getpid(), signal.SIGKILL)
    commit_kill_file = payload.get("kill_after_commit_file")
    if commit_kill_file and os.path.exists(commit_kill_file):
        os.remove(commit_kill_file)
        # Dies right after the commit, before anyone can acknowledge the message.
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    terminate_file = payload.get("terminate_backend_file")
    if payload.get("terminate_backend") == "always" or (
        terminate_file and os.path.exists(terminate_file)
    ):
        if terminate_file:
            os.remove(terminate_file)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    if payload.get("statement_timeout"):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = '50ms'")
            cursor.execute("SELECT pg_sleep(2)")
    if payload.get("fail_text"):  # "<NUL>" stands for a NUL, which no payload may hold
        raise RuntimeError(payload["fail_text"].replace("<NUL>", "\x00"))
    if payload.get("fail_always"):
        raise RuntimeError("this message always fails")
    if (
        payload.get("sleep")
        and payload.get("sleep_on_attempt", message.attempts) == message.attempts
    ):
        time.sleep(payload["sleep"])
    if message.attempts <= payload.get("fail_times", 0):
        raise RuntimeError(f"planned failure on attempt {message.attempts}")
    if payload.get("reject"):
        raise Reject(payload["reject"])
    if payload.get("park"):
        raise Park(payload["park"])


@inbox_handler("effect.write", consumer="effects")
def write_effect(message):
    _write(message, "effects")
    _misbehave(message)


@inbox_handler("effect.write", consumer="stream")
def stream_effect(message):
    _write(message, "stream")
    _misbehave(message)


@inbox_handler("effect.write", consumer="audit")
def audit_effect(message):
    _write(message, "audit")


@inbox_handler("ordered.apply", consumer="ordered")
def apply_ordered(message):
    """Records each version it applies, with its start and end; misbehaves as asked."""
    started = time.time()
    _misbehave(message)
    if isinstance(message.payload, dict) and message.payload.get("hold"):
        time.sleep(message.payload["hold"])
    OrderedRun.objects.create(
        key=message.key,
        sequence=message.sequence,
        message_id=message.message_id,
        started=started,
        ended=time.time(),
        pid=os.getpid(),
    )


def _notify(message, consumer):
    _write(message, consumer)
    _tell_the_customer(message)
    _misbehave(message)


@inbox_handler("effect.notify", consumer="effects")
def notify_effect(message):
    """A database write and two side effects; ``effects`` runs side effects on re-runs."""
    _notify(message, "effects")


@inbox_handler("effect.notify", consumer="notify")
def notify_suppressed(message):
    """The same in ``notify``, which suppresses side effects on re-runs."""
    _notify(message, "notify")


@inbox_handler("projection.apply", consumer="projection")
def apply_projection(message):
    """Fold version ``sequence`` (payload ``n``) into its key's projection; tell someone."""
    _misbehave(message)
    projection, _ = Projection.objects.select_for_update().get_or_create(key=message.key)
    if message.sequence == 1:  # the key's first version starts it afresh (a rebuild's too)
        projection.value = projection.version = 0
    if message.sequence <= projection.version:  # never backwards (a skipped version may jump)
        raise RuntimeError(f"{message.key}: version {message.sequence} after {projection.version}")
    projection.value = (projection.value * 31 + int(message.payload["n"])) % MODULUS
    projection.version = message.sequence
    projection.reruns += int(message.is_rerun)
    projection.save()
    send_receipt(message.message_id)
