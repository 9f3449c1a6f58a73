"""``django_inbox.conf``: settings are read lazily, typed, and per-consumer policies apply.

The parts that run real processes; the rest is in ``tests/unit/test_conf.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import ROOT


def test_import_and_decorate_without_configured_settings() -> None:
    """Importing the package and decorating a handler reads no setting and no database."""
    code = (
        "import django_inbox, django_inbox.conf, django_inbox.registry\n"
        "import django_inbox.processing.retry\n"
        "from django_inbox import inbox_handler\n"
        "@inbox_handler('order.placed', consumer='inventory')\n"
        "def h(message):\n"
        "    pass\n"
        "from django.conf import settings\n"
        "assert not settings.configured\n"
        "assert django_inbox.registry.registry.get('inventory', 'order.placed').func is h\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(ROOT)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
