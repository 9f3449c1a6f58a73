"""Carrying a handler's run into other threads, so that ``@side_effect`` calls made there are
suppressed during a re-run as calls in the handler are.

The run (the message whose handler runs, and whether its re-run suppresses side effects) is
kept in :mod:`contextvars` variables, and a new thread starts with an empty context: without
help, a ``@side_effect`` function called from a ``threading.Thread`` or a thread pool runs
even while a completed message re-runs. :func:`carry_run` takes a copy of the caller's
context when it is called (in the handler) and runs the function in it, wherever and
whenever it is called; :class:`CarryRunExecutor` does so for every function submitted to it.

While the attempt runs, suppressed calls from those threads are counted with it (history,
log, signal, counter). A call made after the attempt ended, from a thread the handler did not
wait for, is suppressed all the same and logged, but recorded nowhere else (see
:mod:`django_inbox.side_effects`). Wait for the work (``future.result()``, ``thread.join()``)
before the handler returns.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def carry_run(fn: Callable[P, T], /) -> Callable[P, T]:
    """``fn``, to be called in the context of the code calling ``carry_run`` now.

    Call it where the run is (in the handler, or code it calls) and hand the result to the
    other thread: ``executor.submit(carry_run(send_receipt), order_id)``,
    ``threading.Thread(target=carry_run(work))``. Each call runs in its own copy of the
    captured context, so one carried function can run in several threads at once
    (``executor.map(carry_run(send_receipt), ids)``). Outside a handler it changes nothing.
    """
    captured = contextvars.copy_context()

    @functools.wraps(fn)
    def run_carried(*args: P.args, **kwargs: P.kwargs) -> T:
        return captured.copy().run(fn, *args, **kwargs)

    return run_carried


class CarryRunExecutor(ThreadPoolExecutor):
    """A :class:`~concurrent.futures.ThreadPoolExecutor` whose ``submit()`` (and so ``map()``)
    carries the submitting code's run into the pool's threads, as :func:`carry_run` does.

    It may be shared by handlers and made once: what is carried is taken at each ``submit()``.
    """

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        return super().submit(carry_run(fn), *args, **kwargs)
