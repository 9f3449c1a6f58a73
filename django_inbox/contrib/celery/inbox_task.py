"""``@inbox_task``: Celery tasks whose database effects happen once.

::

    from django_inbox.contrib.celery import inbox_task

    @inbox_task(consumer="billing", acks_late=True)
    def charge(order_id, amount_cents): ...

    charge.delay(42, 1000)                                               # id: the task id
    charge.apply_async((42, 1000), headers={"idempotency_key": "order-42"})  # or the caller's

The function becomes ``consumer``'s handler for the event type named after the task, and the
Celery task ``deliver()``s the call: the arguments are the payload (``{"args": [...],
"kwargs": {...}}``, checked as JSON when the task is sent), the message id is the
``idempotency_key`` header, else the task id. A task delivered again (``acks_late`` after a
lost worker, a Redis visibility timeout) or sent twice with one key runs its database effects
once: the first run returns the function's value, a duplicate returns ``None`` and says so in
the log.

A failure follows the inbox's policy, not Celery's: the row is ``failed`` with a backoff (then
retried by ``inbox_process`` or the ``process_due`` task), ``dead`` after its attempts, or
``parked``; ``Retry``, ``Reject`` and ``Park`` work as in any handler. The Celery task itself
succeeds once the failure is recorded, so Celery's own retries never double what the inbox
counts.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from celery import Task, shared_task
from celery.exceptions import Ignore

from ...outcomes import Outcome

logger = logging.getLogger("django_inbox.celery")

F = TypeVar("F", bound=Callable[..., Any])

#: The header a caller sets to make two sends one task.
IDEMPOTENCY_HEADER = "idempotency_key"
#: Options of ``shared_task`` that would break the promise, and why.
REFUSED_OPTIONS = {
    "bind": "the task's body is the inbox's; the function gets its own arguments only",
    "autoretry_for": "failures follow the inbox's policy (failed, dead, Retry); Celery's "
    "retries of a recorded failure would run it twice",
    "max_retries": "attempts are the inbox's (max_attempts=)",
    "base": "@inbox_task makes its own Task class",
}

#: ``[(consumer, message id), value]`` of the message a task delivers: what its handler
#: returned, for the task to return it.
_returned: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar(
    "inbox_task_returned", default=None
)


class InboxTask(Task):  # type: ignore[misc]
    """A Celery task that ``deliver()``s each call to the inbox. Its arguments are checked as
    JSON when it is sent, and a chord's header refuses it (see :meth:`apply_async`)."""

    abstract = True
    #: Set by :func:`inbox_task`.
    inbox_consumer: str = ""
    inbox_event_type: str = ""

    def apply_async(self, args: Any = None, kwargs: Any = None, *more: Any, **options: Any) -> Any:
        check_arguments(self.name, args, kwargs)
        headers = options.get("headers") or {}
        key = headers.get(IDEMPOTENCY_HEADER)
        if key is not None:
            from ...intake.validation import clean_message_id

            key = clean_message_id(key)
            if options.get("group_id") is not None and options.get("group_index") is not None:
                # group(...).apply_async(headers=...) gives every member the group's headers:
                # each member is its own message, so its place in the group joins the key.
                key = f"{key}#{options['group_index']}"
                options["headers"] = {**headers, IDEMPOTENCY_HEADER: key}
                clean_message_id(key)
            if options.get("link") or options.get("chain"):
                raise TypeError(
                    f"{self.name} is an @inbox_task sent with an idempotency_key and a "
                    "callback (link= or a chain): a second send with the key returns None, "
                    "which the callback would get. Send the next task from the function."
                )
        if options.get("chord") is not None:
            raise TypeError(
                f"{self.name} is an @inbox_task: it cannot be in a chord's header. A duplicate "
                "of an inbox task returns None, not the first run's value, and the chord's "
                "callback would get it. Call the callback from the task's function instead."
            )
        return super().apply_async(args, kwargs, *more, **options)


def check_arguments(name: str, args: Any, kwargs: Any) -> None:
    """Raise :class:`~django_inbox.InvalidPayload` if a task's arguments are not JSON the
    inbox can store (said when the task is sent, not when a worker runs it)."""
    from ...conf import inbox_settings
    from ...intake.validation import encode_json

    encode_json(
        f"the arguments of {name}",
        {"args": list(args or ()), "kwargs": dict(kwargs or {})},
        max_bytes=inbox_settings.max_payload_bytes,
    )


def inbox_task(
    *,
    consumer: str,
    event_type: str | None = None,
    max_attempts: int | None = None,
    backoff_base: float | str | timedelta | None = None,
    backoff_max: float | str | timedelta | None = None,
    **task_options: Any,
) -> Callable[[F], Any]:
    """Make the function a Celery task whose database effects happen once per message id.

    ``consumer``: the inbox consumer (deduplication, policy, the admin's filter).
    ``event_type``: the handler's event type (default: the task's name).
    ``max_attempts``, ``backoff_base``, ``backoff_max``: the handler's policy, as in
    :func:`~django_inbox.inbox_handler`. Every other keyword goes to Celery's ``shared_task``
    (``name``, ``queue``, ``acks_late``, ``time_limit``, …), except those that would break the
    promise (``bind``, ``autoretry_for``, ``max_retries``, ``base``): ``TypeError``.
    """
    if not isinstance(consumer, str) or not consumer:
        raise TypeError("inbox_task() needs consumer=<non-empty string>")
    for option, reason in REFUSED_OPTIONS.items():
        if option in task_options:
            raise TypeError(f"inbox_task() does not take {option}=: {reason}")

    def decorate(func: F) -> Any:
        if inspect.iscoroutinefunction(func):
            raise TypeError(
                f"inbox_task() cannot wrap the async function {func.__qualname__}: Celery runs "
                "a task's function synchronously. Write it as a plain function (call async "
                "code with asgiref's async_to_sync), or deliver() from your own async consumer "
                "with adeliver()."
            )
        name = task_options.get("name") or f"{func.__module__}.{func.__name__}"
        kind = event_type or name

        def handle(message: Any) -> Any:
            payload = message.payload if isinstance(message.payload, dict) else {}
            value = func(*payload.get("args", ()), **payload.get("kwargs", {}))
            box = _returned.get()
            # Only the run this task delivered: not one its function delivers in turn.
            if box is not None and box[0] == (message.consumer, message.message_id):
                box.append(value)
            return value

        handle.__module__ = func.__module__
        handle.__qualname__ = func.__qualname__
        handle.__name__ = func.__name__
        from ...registry import inbox_handler

        inbox_handler(
            kind,
            consumer=consumer,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
        )(handle)

        def run(self: Task, *args: Any, **kwargs: Any) -> Any:
            return _run(self, consumer, kind, args, kwargs)

        run.__module__ = func.__module__
        run.__qualname__ = func.__qualname__
        run.__name__ = func.__name__
        run.__doc__ = func.__doc__
        base = type(
            f"InboxTask_{func.__name__}",
            (InboxTask,),
            {"inbox_consumer": consumer, "inbox_event_type": kind, "__module__": __name__},
        )
        return shared_task(bind=True, base=base, **{**task_options, "name": name})(run)

    return decorate


def _run(task: Task, consumer: str, event_type: str, args: Any, kwargs: Any) -> Any:
    """One run of an inbox task in a Celery worker: ``deliver()`` the call."""
    from ...intake.delivery import deliver
    from .checks import warn_once

    warn_once(task)
    request = task.request
    given = getattr(request, IDEMPOTENCY_HEADER, None)
    if given is None:
        given = (request.headers or {}).get(IDEMPOTENCY_HEADER)
    message_id = str(given) if given is not None else str(request.id)
    redelivered = bool((request.delivery_info or {}).get("redelivered"))
    box: list[Any] = [(consumer, message_id)]
    token = _returned.set(box)
    try:
        outcome = deliver(
            consumer=consumer,
            message_id=message_id,
            event_type=event_type,
            payload={"args": list(args), "kwargs": dict(kwargs)},
            headers={"celery_task_id": str(request.id), "celery_task": task.name},
            source=f"celery:{task.name}",
            redelivered=redelivered,
        )
    finally:
        _returned.reset(token)
    if outcome == Outcome.PROCESSED:
        return box[1] if len(box) > 1 else None
    level = logging.INFO if outcome in (Outcome.DUPLICATE, Outcome.IN_PROGRESS) else logging.WARNING
    same_task = message_id == str(request.id)
    logger.log(
        level,
        "inbox task %s (message id %s, task id %s): %s; the function's value is not returned",
        task.name,
        message_id,
        request.id,
        _SAID.get(outcome, outcome.value),
    )
    if same_task and outcome in (Outcome.DUPLICATE, Outcome.IN_PROGRESS) and not request.is_eager:
        # This very task again (a redelivery, or a copy of one still running): its first run
        # stored the result and sent the callbacks, or will. Ignore: store nothing, send
        # nothing, so the result stays the first run's and no callback runs twice.
        raise Ignore()
    return None


_SAID = {
    Outcome.DUPLICATE: "a duplicate, its effects were applied before",
    Outcome.IN_PROGRESS: "running in another worker now; the inbox finishes it",
    Outcome.FAILED: "failed and recorded; inbox_process or process_due retries it",
    Outcome.DEAD: "dead (see the admin)",
    Outcome.PARKED: "parked (see the admin)",
}


def is_inbox_task(task: Any) -> bool:
    """Whether a Celery task was made by :func:`inbox_task`."""
    return bool(getattr(task, "inbox_consumer", ""))
