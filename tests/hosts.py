"""Test hosts on this machine (``scripts/hosts``): network namespaces joined to the root
namespace by veth pairs. Each host reaches only the root-side address of its own link, where
the test's own services listen, and its loopback; cutting its link cuts it off from both."""

from __future__ import annotations

import random
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "hosts"


@dataclass(frozen=True)
class Host:
    """Host ``number``: its namespace, its own address and the root-side address of its link
    (where the services it talks to listen)."""

    tag: str
    number: int
    namespace: str
    address: str
    services: str

    @property
    def prefix(self) -> tuple[str, ...]:
        """The command that runs what follows it in this host."""
        return ("ip", "netns", "exec", self.namespace)

    def cut(self) -> None:
        _hosts("cut", self.tag, str(self.number))

    def mend(self) -> None:
        _hosts("mend", self.tag, str(self.number))


def _hosts(*args: str) -> str:
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"scripts/hosts {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


class HostsUnavailable(Exception):
    """The machine allows no network namespaces (the reason is the message)."""


def unavailable() -> str | None:
    """Why hosts cannot be made on this machine, or ``None``."""
    done = subprocess.run([str(SCRIPT), "check"], capture_output=True, text=True, timeout=60)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


@contextmanager
def made_hosts(count: int) -> Iterator[list[Host]]:
    """``count`` hosts for the block, deleted after it. Raises :class:`HostsUnavailable`
    where the machine allows no namespaces."""
    why = unavailable()
    if why:
        raise HostsUnavailable(why)
    tag = "t" + uuid.uuid4().hex[:7]
    for _ in range(20):  # a /24 no interface of this machine uses
        net = f"10.231.{random.randint(1, 254)}"
        done = subprocess.run(
            [str(SCRIPT), "up", tag, str(count), net], capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0:
            break
        _hosts("down", tag)
        assert "in use" in done.stderr, done.stderr
    else:
        raise AssertionError("no free 10.231.X.0/24 network for the test hosts")
    try:
        hosts = []
        for line in done.stdout.splitlines():
            number, namespace, address, services = line.split()
            hosts.append(Host(tag, int(number), namespace, address, services))
        yield hosts
    finally:
        _hosts("down", tag)
