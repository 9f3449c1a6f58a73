"""The helpers users get for testing their own handlers (django_inbox.testing), proved against

The parts that run real processes; the rest is in ``tests/unit/test_testing.py``.
"""

from __future__ import annotations


def test_the_plain_functions_need_no_pytest() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['pytest'] = None\n"
        "import django_inbox.testing as t\n"
        "assert not hasattr(t, 'inbox'), 'no fixture without pytest'\n"
        "print(t.deliver_twice.__name__, t.simulate_crash.__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["deliver_twice", "simulate_crash"]
