"""Settings of the benchmark: the test project's settings plus the ``bench`` app.

``DEBUG`` is off, as in production: with ``DEBUG=True`` Django keeps every query in
``connection.queries``, which would be measured as inbox overhead.

Knobs for the broker consumers the benchmark starts as subprocesses (unset otherwise, so
the in-process figures keep the test project's settings):

- ``BENCH_CONN_MAX_AGE``: ``CONN_MAX_AGE`` of the default database, ``none`` for a persistent
  connection. Django's default (0) closes the connection in every ``close_old_connections()``,
  which a consumer calls between messages: one new PostgreSQL connection per message.
- ``BENCH_DB_APPLICATION_NAME``: the connection's ``application_name``, so the benchmark finds
  the consumer's PostgreSQL backend (and its CPU time) in ``pg_stat_activity``.
- ``BENCH_MAX_PAYLOAD_BYTES``: ``INBOX_MAX_PAYLOAD_BYTES``, so the memory benchmark's consumer
  of large messages admits them.
- ``BENCH_URLCONF``: ``ROOT_URLCONF`` (the webhook benchmark's server: ``bench.webhook_urls``).
- ``BENCH_CELERY_DB_REUSE_MAX``: ``CELERY_DB_REUSE_MAX`` (figure 11's worker that keeps its
  connections; Celery's Django fixup closes them around every task otherwise).
- ``BENCH_DB_POOL``: psycopg's connection pool (``OPTIONS["pool"]``, with ``CONN_MAX_AGE`` 0),
  what Django advises under ASGI, where each request's sync work runs on a thread of its own
  and a per-thread persistent connection would be opened anew for every request.
"""

import os

from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405
DEBUG = False

# Figure 2d: the same handler in an ordered consumer.
INBOX_CONSUMERS = {**INBOX_CONSUMERS, "bench-ordered": {"ordered": True}}  # noqa: F405
# Figure 11: the benchmark's @inbox_task (bench/tasks.py).
INBOX_CONSUMERS["bench-tasks"] = {}

_conn_max_age = os.environ.get("BENCH_CONN_MAX_AGE")
if _conn_max_age is not None:
    _age = None if _conn_max_age.strip().lower() in ("", "none") else int(_conn_max_age)
    DATABASES["default"]["CONN_MAX_AGE"] = _age  # noqa: F405
_application_name = os.environ.get("BENCH_DB_APPLICATION_NAME")
if _application_name:
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = _application_name  # noqa: F405
_max_payload = os.environ.get("BENCH_MAX_PAYLOAD_BYTES")
if _max_payload:
    INBOX_MAX_PAYLOAD_BYTES = int(_max_payload)
_urlconf = os.environ.get("BENCH_URLCONF")
if _urlconf:
    ROOT_URLCONF = _urlconf
# Figure 11: a Celery worker that keeps its database connections between tasks.
_reuse = os.environ.get("BENCH_CELERY_DB_REUSE_MAX")
if _reuse:
    CELERY_DB_REUSE_MAX = int(_reuse)
if os.environ.get("BENCH_DB_POOL"):
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {"min_size": 8, "max_size": 16}  # noqa: F405
