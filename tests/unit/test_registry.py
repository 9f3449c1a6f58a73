"""``django_inbox.registry``: ``@inbox_handler``, lookups and autodiscovery."""

from __future__ import annotations

import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

from django_inbox import HandlerAlreadyRegistered, inbox_handler
from django_inbox.registry import Handler, Registry, registry


def first(message: object) -> None:
    pass


def second(message: object) -> None:
    pass


def handler(consumer: str, event_type: str, func=first, **options: object) -> Handler:  # type: ignore[no-untyped-def]
    return Handler(consumer=consumer, event_type=event_type, func=func, **options)  # type: ignore[arg-type]


@pytest.fixture
def global_cleanup() -> Iterator[list[tuple[str, str]]]:
    """Keys registered on the global registry during a test, removed afterwards."""
    keys: list[tuple[str, str]] = []
    before = {(h.consumer, h.event_type): h for h in registry}
    yield keys
    for consumer, event_type in keys:
        registry.unregister(consumer, event_type)
    after = {(h.consumer, h.event_type): h for h in registry}
    assert after == before, "a test leaked handlers into the global registry"


# --- Registry --------------------------------------------------------------------------------


def test_register_and_get() -> None:
    reg = Registry()
    h = handler("inventory", "order.placed", max_attempts=3)
    reg.register(h)
    assert reg.get("inventory", "order.placed") is h
    assert reg.get("inventory", "order.cancelled") is None
    assert reg.get("payments", "order.placed") is None
    assert len(reg) == 1
    assert list(reg) == [h]


def test_handler_name_is_module_and_qualname() -> None:
    assert handler("c", "e").name == f"{__name__}.first"


def test_same_function_registered_again_is_allowed() -> None:
    reg = Registry()
    reg.register(handler("inventory", "order.placed", max_attempts=3))
    again = handler("inventory", "order.placed", max_attempts=5)
    reg.register(again)  # e.g. the module was imported a second time
    assert reg.get("inventory", "order.placed") is again
    assert len(reg) == 1


def test_same_module_and_qualname_counts_as_the_same_function() -> None:
    def make() -> object:
        def reserve(message: object) -> None:
            pass

        return reserve

    one, two = make(), make()
    assert one is not two
    reg = Registry()
    reg.register(handler("inventory", "order.placed", func=one))
    reg.register(handler("inventory", "order.placed", func=two))
    assert reg.get("inventory", "order.placed").func is two  # type: ignore[union-attr]


def test_different_function_for_same_key_is_refused_with_a_clear_message() -> None:
    reg = Registry()
    reg.register(handler("inventory", "order.placed", func=first))
    with pytest.raises(HandlerAlreadyRegistered) as info:
        reg.register(handler("inventory", "order.placed", func=second))
    message = str(info.value)
    assert "'order.placed'" in message
    assert "'inventory'" in message
    assert f"{__name__}.first" in message
    assert f"{__name__}.second" in message
    assert reg.get("inventory", "order.placed").func is first  # type: ignore[union-attr]
    assert isinstance(info.value, ImproperlyConfigured)


def test_same_function_in_two_consumers_is_fan_out() -> None:
    reg = Registry()
    reg.register(handler("inventory", "order.placed", func=first))
    reg.register(handler("payments", "order.placed", func=first))
    reg.register(handler("inventory", "order.cancelled", func=second))
    assert len(reg) == 3


def test_lookups() -> None:
    reg = Registry()
    reg.register(handler("payments", "order.placed"))
    reg.register(handler("inventory", "order.placed"))
    reg.register(handler("inventory", "order.cancelled"))
    reg.register(handler("inventory", "stock.counted"))
    reg.register(handler("audit", "user.deleted"))
    assert reg.consumers() == ["audit", "inventory", "payments"]
    assert reg.event_types("inventory") == ["order.cancelled", "order.placed", "stock.counted"]
    assert reg.event_types("payments") == ["order.placed"]
    assert reg.event_types("nobody") == []
    assert reg.consumers_for("order.placed") == ["inventory", "payments"]
    assert reg.consumers_for("user.deleted") == ["audit"]
    assert reg.consumers_for("nothing") == []


def test_unregister() -> None:
    reg = Registry()
    reg.register(handler("inventory", "order.placed"))
    reg.unregister("inventory", "order.placed")
    reg.unregister("inventory", "order.placed")  # absent: no error
    assert reg.get("inventory", "order.placed") is None
    assert len(reg) == 0
    assert reg.consumers() == []


def test_iteration_is_a_snapshot() -> None:
    reg = Registry()
    reg.register(handler("a", "x"))
    reg.register(handler("b", "x"))
    for h in reg:
        reg.unregister(h.consumer, h.event_type)  # no "dict changed size" error
    assert len(reg) == 0


def test_fresh_registry_is_empty() -> None:
    reg = Registry()
    assert len(reg) == 0
    assert reg.import_errors == []


# --- the global registry and @inbox_handler ---------------------------------------------------


def test_testproject_handlers_are_discovered() -> None:
    assert {"inventory", "payments", "effects", "audit"} <= set(registry.consumers())
    assert registry.consumers_for("order.placed") == ["inventory", "payments"]
    assert registry.get("inventory", "order.placed").name == "shop.inbox_handlers.reserve_stock"  # type: ignore[union-attr]
    assert registry.get("effects", "effect.write").name == "effects.inbox_handlers.write_effect"  # type: ignore[union-attr]
    assert registry.import_errors == []


def test_decorator_registers_and_returns_the_function(global_cleanup) -> None:  # type: ignore[no-untyped-def]
    global_cleanup.append(("unit-registry", "thing.happened"))

    @inbox_handler("thing.happened", consumer="unit-registry", max_attempts=2, backoff_base=0.5)
    def on_thing(message: object) -> str:
        return "ran"

    assert on_thing(None) == "ran"
    registered = registry.get("unit-registry", "thing.happened")
    assert registered is not None
    assert registered.func is on_thing
    assert registered.max_attempts == 2
    assert registered.backoff_base == 0.5
    assert registered.backoff_max is None
    assert "unit-registry" in registry.consumers()


def test_decorator_same_function_twice_is_allowed(global_cleanup) -> None:  # type: ignore[no-untyped-def]
    global_cleanup.append(("unit-registry", "thing.happened"))
    inbox_handler("thing.happened", consumer="unit-registry")(first)
    inbox_handler("thing.happened", consumer="unit-registry", max_attempts=3)(first)
    assert registry.get("unit-registry", "thing.happened").max_attempts == 3  # type: ignore[union-attr]


def test_decorator_second_function_is_refused(global_cleanup) -> None:  # type: ignore[no-untyped-def]
    global_cleanup.append(("unit-registry", "thing.happened"))
    inbox_handler("thing.happened", consumer="unit-registry")(first)
    with pytest.raises(HandlerAlreadyRegistered, match="already has the handler"):
        inbox_handler("thing.happened", consumer="unit-registry")(second)
    assert registry.get("unit-registry", "thing.happened").func is first  # type: ignore[union-attr]


def test_second_handler_for_a_testproject_key_is_refused() -> None:
    with pytest.raises(
        HandlerAlreadyRegistered, match=re.escape("shop.inbox_handlers.reserve_stock")
    ):
        inbox_handler("order.placed", consumer="inventory")(second)
    assert registry.get("inventory", "order.placed").name == "shop.inbox_handlers.reserve_stock"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        (("",), {"consumer": "c"}, TypeError, "event type"),
        ((None,), {"consumer": "c"}, TypeError, "event type"),
        ((5,), {"consumer": "c"}, TypeError, "event type"),
        (("e",), {"consumer": ""}, TypeError, "consumer"),
        (("e",), {"consumer": None}, TypeError, "consumer"),
        (("e",), {"consumer": 3}, TypeError, "consumer"),
        (("e",), {"consumer": "c", "max_attempts": 0}, ValueError, "max_attempts"),
        (("e",), {"consumer": "c", "max_attempts": -1}, ValueError, "max_attempts"),
        (("e",), {"consumer": "c", "max_attempts": "3"}, ValueError, "max_attempts"),
        (("e",), {"consumer": "c", "max_attempts": 2.5}, ValueError, "max_attempts"),
    ],
)
def test_bad_decorator_arguments_raise_and_register_nothing(
    args: tuple[object, ...], kwargs: dict[str, object], exc: type[Exception], match: str
) -> None:
    before = len(registry)
    with pytest.raises(exc, match=match):
        inbox_handler(*args, **kwargs)(first)  # type: ignore[arg-type]
    assert len(registry) == before


def test_consumer_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        inbox_handler("e", "c")(first)  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backoff_base": -1.0},
        {"backoff_base": "soon"},
        {"backoff_max": -5.0},
        {"backoff_max": float("nan")},
    ],
)
def test_bad_backoff_arguments_raise(global_cleanup, kwargs: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    global_cleanup.append(("unit-registry", "bad.backoff"))
    with pytest.raises((TypeError, ValueError)):
        inbox_handler("bad.backoff", consumer="unit-registry", **kwargs)(first)  # type: ignore[arg-type]


# --- autodiscover ----------------------------------------------------------------------------


@pytest.fixture
def fake_apps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Throwaway packages under ``tmp_path``; ``apps.get_app_configs()`` lists them."""
    created = ["unitapp_good", "unitapp_broken", "unitapp_missing_dep", "unitapp_without"]
    files = {
        "unitapp_good/__init__.py": "",
        "unitapp_good/inbox_handlers.py": "LOADED = True\n",
        "unitapp_broken/__init__.py": "",
        "unitapp_broken/inbox_handlers.py": textwrap.dedent(
            """
            def helper():
                raise RuntimeError("handler module exploded")

            helper()
            """
        ),
        "unitapp_missing_dep/__init__.py": "",
        "unitapp_missing_dep/inbox_handlers.py": "import unit_no_such_package_xyz\n",
        "unitapp_without/__init__.py": "",
        "unitapp_good/handlers_v2.py": "LOADED = 2\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    configs = [SimpleNamespace(name=name) for name in [*created, "unitapp_not_importable_at_all"]]
    monkeypatch.setattr(apps, "get_app_configs", lambda: configs)
    yield tmp_path
    for module in list(sys.modules):
        if module.split(".")[0] in created:
            del sys.modules[module]


def test_autodiscover_imports_modules_and_records_failures(fake_apps: Path) -> None:
    reg = Registry()
    reg.autodiscover("inbox_handlers")
    assert sys.modules["unitapp_good.inbox_handlers"].LOADED is True
    assert "unitapp_without.inbox_handlers" not in sys.modules
    failed = dict(reg.import_errors)
    assert set(failed) == {"unitapp_broken.inbox_handlers", "unitapp_missing_dep.inbox_handlers"}
    assert "RuntimeError: handler module exploded" in failed["unitapp_broken.inbox_handlers"]
    assert "unit_no_such_package_xyz" in failed["unitapp_missing_dep.inbox_handlers"]
    assert "Traceback" in failed["unitapp_broken.inbox_handlers"]
    # The global registry is untouched.
    assert registry.import_errors == []


def test_autodiscover_uses_the_configured_module_name(fake_apps: Path) -> None:
    reg = Registry()
    reg.autodiscover("handlers_v2")
    assert sys.modules["unitapp_good.handlers_v2"].LOADED == 2
    assert "unitapp_good.inbox_handlers" not in sys.modules
    assert reg.import_errors == []


def test_autodiscover_registers_decorated_handlers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, global_cleanup
) -> None:  # type: ignore[no-untyped-def]
    package = tmp_path / "unitapp_handlers"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "inbox_handlers.py").write_text(
        "from django_inbox import inbox_handler\n"
        "@inbox_handler('unit.discovered', consumer='unit-discovery')\n"
        "def discovered(message):\n"
        "    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(apps, "get_app_configs", lambda: [SimpleNamespace(name=package.name)])
    global_cleanup.append(("unit-discovery", "unit.discovered"))
    try:
        Registry().autodiscover("inbox_handlers")
        found = registry.get("unit-discovery", "unit.discovered")
        assert found is not None
        assert found.name == "unitapp_handlers.inbox_handlers.discovered"
    finally:
        sys.modules.pop("unitapp_handlers.inbox_handlers", None)
        sys.modules.pop("unitapp_handlers", None)
