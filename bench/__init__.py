"""Benchmark suite of django-transactional-inbox (run it with ``./scripts/bench``).

The package is also a tiny Django app (``bench``) so that the benchmark handler is found by
autodiscovery in the bench process *and* in ``manage.py inbox_process`` subprocesses started
with ``DJANGO_SETTINGS_MODULE=bench.settings``. Nothing here is a test.
"""
