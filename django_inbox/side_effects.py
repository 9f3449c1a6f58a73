"""``@side_effect``: functions that act outside the database, and what a re-run does with them.

A handler's database writes commit with its message's ``completed`` status, so running it
again (an operator's forced re-run, a rebuild) rewrites the same state. A call outside the
database (an e-mail, a payment API, a publication) happened when the message first completed,
and running it again repeats it. Decorating such a function with :func:`side_effect` lets a
consumer's policy decide: with ``"side_effects_on_rerun": "suppress"``, while a completed
message re-runs, a call does not run and returns ``None``, and leaves a trace:

- an entry ``{"kind": "suppressed", "function": …, "attempt": …}`` in the row's history,
  written with the attempt's outcome (the completion, or the failure that is recorded);
- a log line on the ``django_inbox`` logger at once (never the call's arguments, nor the
  payload);
- the ``side_effect_suppressed`` signal and the Prometheus counter
  ``inbox_side_effects_suppressed_total{consumer,function}`` when the attempt commits.

Outside re-runs, outside handlers, and for consumers with ``"run"`` (the default), a decorated
function runs as if undecorated. The re-run is found through a :mod:`contextvars` variable,
so it reaches functions the handler calls, however deep, and coroutines it awaits. Threads do
not inherit it: work handed to another thread (a ``threading.Thread``, a thread pool) carries
the re-run only when wrapped with :func:`~django_inbox.side_effect_threads.carry_run` (or
submitted to a :class:`~django_inbox.side_effect_threads.CarryRunExecutor`).

Calls from such threads count with the attempt while it runs. A call made after the attempt
ended (a thread the handler did not wait for) is still suppressed and logged, but it is in no
history entry, signal or counter: the attempt's outcome is written by then, and the row may
have moved on.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from . import clock, events, history, signals
from .conf import inbox_settings
from .db import on_commit

if TYPE_CHECKING:
    from .models import InboxMessage

F = TypeVar("F", bound=Callable[..., Any])

#: The attribute a decorated function carries: the name its suppressions are recorded under.
NAME_ATTRIBUTE = "inbox_side_effect"
#: Names of the functions decorated in this process so far (what a dry run can name).
known: set[str] = set()


@dataclass
class Suppressing:
    """A re-run in progress whose consumer suppresses side effects: what it suppressed.

    Threads that carry the re-run's context share it: :meth:`count` and :meth:`close` hold
    its lock, so a call either makes it into ``functions`` before the attempt's entries are
    written, or is a late one (``count`` gives ``False``).
    """

    message: InboxMessage
    using: str
    functions: list[str] = field(default_factory=list)
    #: Whether calls still count with the attempt (``False`` once its entries are written).
    open: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, function: str) -> bool:
        """Count a suppressed call of ``function`` with the attempt; ``False`` if too late."""
        with self.lock:
            if self.open:
                self.functions.append(function)
            return self.open

    def close(self) -> int:
        """Stop counting calls; how many were counted (``functions`` no longer changes)."""
        with self.lock:
            self.open = False
            return len(self.functions)

    def reopen(self) -> int:
        """Count calls again (an on-commit callback of the attempt runs); how many so far."""
        with self.lock:
            self.open = True
            return len(self.functions)


_rerun: ContextVar[Suppressing | None] = ContextVar("django_inbox_rerun", default=None)
#: The message whose handler runs in this context (set by ``calling.run_handler``): what the
#: outbox records as the cause of what the handler publishes.
running_message: ContextVar[InboxMessage | None] = ContextVar(
    "django_inbox_running_message", default=None
)


def current_message() -> InboxMessage | None:
    """The inbox message whose handler is running here (in code it calls too), if any."""
    return running_message.get()


@overload
def side_effect(func: F, /) -> F: ...
@overload
def side_effect(*, name: str | None = None) -> Callable[[F], F]: ...


def side_effect(func: Any = None, /, *, name: str | None = None) -> Any:
    """Mark ``func`` as acting outside the database (send mail, call an API, publish).

    Use it bare (``@side_effect``) or with the name its suppressions are recorded under
    (``@side_effect(name="mail.receipt")``; by default ``module.qualname``). Works for plain
    functions and ``async def`` ones (the coroutine returns ``None`` when suppressed).
    """

    def decorate(target: F) -> F:
        label = name or f"{target.__module__}.{target.__qualname__}"
        wrapper: Any
        if inspect.isgeneratorfunction(target):

            @functools.wraps(target)
            def generator_wrapper(*args: Any, **kwargs: Any) -> Any:
                if suppressed(label):
                    return iter(())  # what a loop over the suppressed call sees: nothing
                return target(*args, **kwargs)

            wrapper = generator_wrapper
        elif inspect.isasyncgenfunction(target):

            @functools.wraps(target)
            def async_generator_wrapper(*args: Any, **kwargs: Any) -> Any:
                if suppressed(label):
                    return _nothing()
                return target(*args, **kwargs)

            wrapper = async_generator_wrapper
        elif inspect.iscoroutinefunction(target):

            @functools.wraps(target)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if suppressed(label):
                    return None
                return await target(*args, **kwargs)

            wrapper = async_wrapper
        else:

            @functools.wraps(target)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                if suppressed(label):
                    return None
                return target(*args, **kwargs)

            wrapper = sync_wrapper
        setattr(wrapper, NAME_ATTRIBUTE, label)
        known.add(label)
        return wrapper  # type: ignore[no-any-return]

    return decorate(func) if func is not None else decorate


def suppressed(function: str) -> bool:
    """Whether a call of the side effect ``function`` is to be skipped now; if so, say so."""
    state = _rerun.get()
    if state is None:
        return False
    detail = f"side effect {function} not run: re-run of a completed message"
    if not state.count(function):
        # A thread that carried the re-run outlived its attempt: the attempt's entries are
        # written, and the row may be in another attempt now. Skipped and logged, no more.
        detail += " (called after the attempt ended: not in the row's history)"
    # Logged now; the signal is sent when the handler returns (this may be a coroutine on an
    # event loop, where Django refuses database work, and the signal waits for the commit).
    events.event(
        "suppressed", **events.about(state.message, state.using), detail=detail, send_signal=False
    )
    return True


async def _nothing() -> AsyncIterator[Any]:
    """An async iterator that yields nothing (a suppressed async generator's calls)."""
    return
    yield


def suppresses(message: InboxMessage) -> bool:
    """Whether ``message``'s handler runs as a re-run whose side effects are suppressed."""
    return bool(message.rerun) and inbox_settings.policy(message.consumer).suppresses_side_effects


@contextmanager
def handler_context(message: InboxMessage, using: str) -> Iterator[Suppressing | None]:
    """What a handler of ``message`` runs in: :func:`current_message`, and for a re-run whose
    consumer suppresses side effects, the suppression (``None`` otherwise, so that a message
    the handler delivers itself is not suppressed with it).

    On the way out, whatever happened, the calls suppressed become history entries in
    ``message.history`` (in memory: the attempt's outcome writes them), one per function
    with its number of calls. Callbacks the handler registered with
    ``transaction.on_commit()`` on the inbox's database run after the commit in the same
    suppression; what they suppress is written to the row then.
    """
    state = Suppressing(message, using) if message.rerun and suppresses(message) else None
    running = running_message.set(message)
    rerun = _rerun.set(state)
    pending = _callbacks(using) if state is not None else None
    try:
        yield state
    finally:
        _rerun.reset(rerun)
        running_message.reset(running)
        if state is not None:
            state.close()
            if pending is not None:
                _keep_suppressing(state, pending)
            _record(state)


def _callbacks(using: str) -> int | None:
    """How many on-commit callbacks the connection holds now (``None`` if this Django keeps
    them otherwise)."""
    found = on_commit.pending(using)
    return None if found is None else len(found)


def _keep_suppressing(state: Suppressing, before: int) -> None:
    """Run the on-commit callbacks the handler added in ``state``'s suppression. Read again
    now: a savepoint rolled back inside the handler replaces the list (dropping only
    callbacks added inside it, so those added before the handler keep their places)."""
    callbacks = on_commit.pending(state.using)
    if callbacks is None:
        return
    for index in range(before, len(callbacks)):
        callback = on_commit.callback_of(callbacks[index])
        if callback is None:
            return
        savepoints, _, robust = callbacks[index]
        callbacks[index] = (savepoints, _after_commit(state, callback), robust)


def _after_commit(state: Suppressing, callback: Any) -> Any:
    def run() -> None:
        token = _rerun.set(state)
        done = state.reopen()
        try:
            callback()
        finally:
            _rerun.reset(token)
            if state.close() > done:  # written now: the attempt has committed
                from .intake.rows import append_history

                # Appended to the row as it is now: another writer may have added entries
                # since the commit (an operator's action), which writing back the history
                # held in memory would lose.
                append_history(state.message.pk, _record(state, start=done), state.using)

    return run


def _record(state: Suppressing, *, start: int = 0) -> list[dict[str, Any]]:
    """History entries (one per function, with its count of calls) and signals for the calls
    ``state`` suppressed from index ``start`` on; the entries are appended to the message's
    history in memory, and returned."""
    message, using = state.message, state.using
    calls: dict[str, int] = {}
    for function in state.functions[start:]:
        calls[function] = calls.get(function, 0) + 1
    now = clock.now()
    listened = signals.listened(signals.side_effect_suppressed)
    entries = []
    for function, count in calls.items():
        entry = history.suppressed_entry(function, message.attempts, at=now, calls=count)
        entries.append(entry)
        message.history = history.append(message.history, entry)
        if listened:  # sent if the attempt commits (at once after it)
            about = events.about(message, using)
            arguments = {**about, "duration": None, "message": message}
            del arguments["using"]
            signals.send(
                signals.side_effect_suppressed,
                arguments,
                {"function": function, "calls": count},
                using,
            )
    return entries
