"""Handlers for the crash tests. The payload tells each run how to misbehave:

``kill``: ``"always"`` SIGKILLs the worker after the write, every attempt;
``kill_file``: SIGKILL after the write only if that file exists (it is removed first, so
the next attempt survives); ``kill_after_commit_file``: the same, right after the commit;
``fail_always``: raise every attempt; ``fail_times``: raise on the first N attempts; ``sleep``
(seconds) on ``sleep_on_attempt``: hold the transaction open after the write.
"""

import os
import signal
import time

from django.db import transaction

from django_inbox import Park, Reject, inbox_handler

from .models import Effect


def _write(message, consumer):
    Effect.objects.create(
        consumer=consumer,
        message_id=message.message_id,
        attempt=message.attempts,
        pid=os.getpid(),
    )


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
