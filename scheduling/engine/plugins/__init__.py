"""The plugin registry: every module in this package that defines `NAME` and one plugin class is found here.

Adding a plugin is adding a module (see docs/engine.md); nothing else needs editing. `REGISTRY` maps NAME -> class;
a class is checked against the hook protocols when it is registered.
A module may also define `PROFILES` (a tuple of `Profile`) to register named profiles with `profiles.get_profile`.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from scheduling.engine.hooks import check_plugin_class

REGISTRY: dict[str, type] = {}
EXTRA_PROFILES: list[Any] = []


def register(cls: type, *, name: str | None = None) -> type:
    """Register a plugin class under its NAME (also usable as a decorator for plugins living elsewhere).

    The class is checked against the engine's hook protocols first (`hooks.check_plugin_class`): a public method
    that is no hook, a hook with the wrong arguments or a `CACHEABLE` that is not a bool fail here."""
    check_plugin_class(cls)
    key = name or cls.NAME
    existing = REGISTRY.get(key)
    if existing is not None and existing is not cls:
        raise ValueError(f"two plugins are named {key!r}: {existing.__module__} and {cls.__module__}")
    REGISTRY[key] = cls
    return cls


def _plugin_class(module: Any) -> type | None:
    """The module's plugin: the class defined in it whose NAME equals the module's NAME."""
    name = getattr(module, "NAME", None)
    if name is None:
        return None
    for _, obj in inspect.getmembers(module, inspect.isclass):
        if obj.__module__ == module.__name__ and getattr(obj, "NAME", None) == name:
            return obj
    raise ValueError(f"plugin module {module.__name__} defines NAME={name!r} but no class with that NAME")


def _discover() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        cls = _plugin_class(module)
        if cls is not None:
            register(cls)
        EXTRA_PROFILES.extend(getattr(module, "PROFILES", ()))


def get_plugin(name: str) -> Any:
    """A fresh instance of the plugin registered under `name`."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown plugin {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
    return cls()


_discover()
