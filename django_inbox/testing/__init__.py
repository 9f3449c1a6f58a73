"""Helpers for testing your own handlers: deliver twice, crash before the commit, run the worker.

Each helper goes through the inbox's real code paths (:func:`django_inbox.deliver`, the
worker's claim and lease); nothing is re-implemented or mocked. Use them from any test that
may use the database::

    from django_inbox.testing import deliver_twice, simulate_crash, run_worker

or, with pytest, load the fixtures in your ``conftest.py``::

    pytest_plugins = ["django_inbox.testing"]

and ask for the ``inbox`` fixture. Importing this module does not need pytest, and does not
need the app registry either (Django's modules are loaded on first use).

They work in ``transaction=True`` tests (``TransactionTestCase``), where every transaction
really commits, and in plain ``django_db`` tests (``TestCase``), where the inbox's
transactions are savepoints inside the test's transaction: see the how-to "Test your
handlers" for what differs.

The helpers raise their ``AssertionError`` themselves (they use no ``assert`` statement), so
pytest need not rewrite this module: PYTEST_DONT_REWRITE.
"""

from __future__ import annotations

from importlib.util import find_spec

from .checks import check_exactly_once
from .crash import CrashPlan, SimulatedCrash, crash_after_handler, simulate_crash
from .deliveries import deliver_times, deliver_twice
from .fixture import Inbox
from .worker import run_worker

if find_spec("pytest") is not None:  # the fixture, for pytest_plugins = ["django_inbox.testing"]
    from .fixture import inbox  # noqa: F401

__all__ = [
    "CrashPlan",
    "Inbox",
    "SimulatedCrash",
    "check_exactly_once",
    "crash_after_handler",
    "deliver_times",
    "deliver_twice",
    "run_worker",
    "simulate_crash",
]
