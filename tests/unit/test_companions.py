"""The core never imports the optional outbox: the outbox registers what the inbox asks of it
(stats, problems, purge, the Celery relay task) through :mod:`django_inbox.companions`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.apps import apps
from django.test import override_settings

from django_inbox import companions
from tests.conftest import ROOT

PACKAGE = ROOT / "django_inbox"


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (functions included), made absolute."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found += [f"{base}.{alias.name}" for alias in node.names] + [base]
    return found


def test_no_module_outside_the_outbox_imports_it() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            {name for name in _imports(path) if f"{name}.".startswith("django_inbox.outbox.")}
        )
        for path in PACKAGE.rglob("*.py")
        if "outbox" not in path.relative_to(PACKAGE).parts[0]
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_outbox_registers_its_companion_when_ready() -> None:
    from django_inbox.outbox.services import OutboxCompanion

    assert apps.is_installed(companions.OUTBOX)
    assert isinstance(companions.outbox(), OutboxCompanion)


def test_without_the_outbox_installed_the_inbox_goes_without_it() -> None:
    installed = [
        config.name for config in apps.get_app_configs() if config.name != companions.OUTBOX
    ]
    with override_settings(INSTALLED_APPS=installed):
        assert companions.outbox() is None
        from django_inbox.services.problems import outbox_problems

        assert outbox_problems(object(), 60.0, ()) == []


@pytest.mark.django_db
def test_the_celery_relay_task_refuses_without_the_outbox() -> None:
    pytest.importorskip("celery")
    from django_inbox.contrib.celery.tasks import outbox_relay

    installed = [
        config.name for config in apps.get_app_configs() if config.name != companions.OUTBOX
    ]
    with override_settings(INSTALLED_APPS=installed), pytest.raises(ValueError, match="outbox"):
        outbox_relay.run(broker_url="amqp://guest:guest@127.0.0.1:5672//")
