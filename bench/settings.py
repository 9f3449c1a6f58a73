"""Settings of the benchmark: the test project's settings plus the ``bench`` app.

``DEBUG`` is off, as in production: with ``DEBUG=True`` Django keeps every query in
``connection.queries``, which would be measured as inbox overhead.
"""

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405
DEBUG = False
