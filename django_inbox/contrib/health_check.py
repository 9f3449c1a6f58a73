"""A `django-health-check <https://pypi.org/project/django-health-check/>`_ check (extra
``health-check``): the inbox's problems, as ``inbox_stats`` and the health view find them.

.. code-block:: python

    # urls.py
    from health_check.views import HealthCheckView

    urlpatterns = [
        path("ht/", HealthCheckView.as_view(checks=[
            "health_check.checks.Database",
            "django_inbox.contrib.health_check.Inbox",
            # one consumer, dead rows not counted (a readiness probe):
            ("django_inbox.contrib.health_check.Inbox", {"consumer": "payments",
                                                         "ignore": ("dead",)}),
        ])),
    ]

The check fails (``Unavailable``) with the problems' own lines (counts and ids, never a
payload), or when the inbox's table cannot be read.
"""

from __future__ import annotations

import dataclasses

from django.db import DatabaseError, connections
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable

from ..conf import inbox_settings
from ..services import PROBLEM_KINDS, collect

#: The most problems one failure names (the rest are counted).
SHOWN = 5


@dataclasses.dataclass
class Inbox(HealthCheck):  # type: ignore[misc]  # HealthCheck is not annotated
    """The inbox's health: ``consumer`` (all by default), problem kinds to ``ignore`` (of
    ``inbox_stats --ignore``), and ``max_pending_age`` in seconds (``INBOX_MAX_PENDING_AGE``
    by default)."""

    consumer: str | None = None
    ignore: tuple[str, ...] = ()
    max_pending_age: float | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.ignore) - set(PROBLEM_KINDS))
        if unknown:
            raise ValueError(f"unknown problem kind(s) {unknown}: choose among {PROBLEM_KINDS}")

    def run(self) -> None:
        try:
            stats = collect(
                consumer=self.consumer,
                ignore=tuple(self.ignore),
                max_pending_age=self.max_pending_age,
            )
        except DatabaseError as exc:
            raise ServiceUnavailable(
                f"cannot read the inbox table ({type(exc).__name__})"
            ) from None
        finally:
            # Run in django-health-check's thread pool: its connection ends with the check.
            connections[inbox_settings.database].close()
        if stats.problems:
            said = [problem.message for problem in stats.problems[:SHOWN]]
            more = len(stats.problems) - SHOWN
            raise ServiceUnavailable(
                "; ".join(said) + (f"; and {more} more problem(s)" if more > 0 else "")
            )
