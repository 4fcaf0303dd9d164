"""The hooks the engine calls and the checks a plugin class passes: at registration (every public method is a hook
with the protocol's arguments) and when a profile names it (it implements that extension point's protocol).

The protocols themselves live in `framework.py`; this module only knows which is which.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass

from scheduling.engine.framework import (
    AdmitChargeHook,
    AdmitPlugin,
    BatchNodeScorer,
    BorrowedHook,
    CardChooser,
    FilterPlugin,
    GpuScorePlugin,
    ModelAdmitHook,
    ModelBorrowedHook,
    ModelRestrictionHook,
    NodeScorePlugin,
    QueueOrderPlugin,
)


class PluginError(ValueError):
    """A plugin class or a profile's use of it breaks the engine's hook rules."""


@dataclass(frozen=True, slots=True)
class ExtensionPoint:
    """A profile field naming plugins: the protocol each must implement and the optional ones it may add."""

    field: str
    protocol: type
    optional: tuple[type, ...] = ()


EXTENSION_POINTS: dict[str, ExtensionPoint] = {
    p.field: p
    for p in (
        ExtensionPoint("queue_order", QueueOrderPlugin),
        ExtensionPoint(
            "admit",
            AdmitPlugin,
            (AdmitChargeHook, BorrowedHook, ModelRestrictionHook, ModelAdmitHook, ModelBorrowedHook),
        ),
        ExtensionPoint("filters", FilterPlugin),
        ExtensionPoint("node_scores", NodeScorePlugin, (BatchNodeScorer,)),
        ExtensionPoint("gpu_scores", GpuScorePlugin, (CardChooser,)),
    )
}

# Class attributes a plugin may set, and the type each must have.
ATTRIBUTES: dict[str, type] = {"NAME": str, "CACHEABLE": bool, "NODE_FIT": bool}


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(value)
        for name, value in vars(protocol).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }


PROTOCOLS: tuple[type, ...] = tuple(
    dict.fromkeys(proto for point in EXTENSION_POINTS.values() for proto in (point.protocol, *point.optional))
)
# Hook name -> (its protocol, the protocol's signature of it).
HOOKS: dict[str, tuple[type, inspect.Signature]] = {
    name: (proto, sig) for proto in PROTOCOLS for name, sig in _methods(proto).items()
}


def implements(cls: type, protocol: type) -> bool:
    """Whether the class defines every method of the protocol (it was checked against them at registration)."""
    return all(callable(getattr(cls, name, None)) for name in _methods(protocol))


def _arity(sig: inspect.Signature, *, skip: int) -> tuple[int, float, list[str]]:
    """(required positional arguments, most positional arguments, required keyword-only ones) after `skip`."""
    params = list(sig.parameters.values())[skip:]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(1 for p in positional if p.default is p.empty)
    most: float = float("inf") if any(p.kind is p.VAR_POSITIONAL for p in params) else len(positional)
    keyword_only = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    return required, most, keyword_only


def _own_members(cls: type) -> dict[str, object]:
    """Public members defined by the class and its bases (not by `object` or a protocol it subclasses)."""
    members: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or getattr(klass, "_is_protocol", False) or klass.__module__ == "typing":
            continue
        members.update({k: v for k, v in vars(klass).items() if not k.startswith("_")})
    return members


def _where(cls: type) -> str:
    return f"plugin class {cls.__module__}.{cls.__qualname__}"


def check_plugin_class(cls: type) -> None:
    """Refuse a plugin class that the engine would misread: a public method that is no hook (a misspelt hook
    would otherwise never be called), a hook with other arguments than its protocol's, half of
    `ModelRestrictionHook`, a `CACHEABLE` or `NODE_FIT` that is not a bool, or no extension point at all."""
    where = _where(cls)
    name = getattr(cls, "NAME", None)
    if not isinstance(name, str) or not name:
        raise PluginError(f"{where}: NAME must be a non-empty string, not {name!r}")
    for attr, kind in ATTRIBUTES.items():
        if attr in dir(cls) and not isinstance(getattr(cls, attr), kind):
            raise PluginError(f"{where}: {attr} must be a {kind.__name__}, not {getattr(cls, attr)!r}")
    for member, raw in sorted(_own_members(cls).items()):
        if isinstance(raw, staticmethod):
            fn, skip = raw.__func__, 0
        elif isinstance(raw, classmethod):
            fn, skip = raw.__func__, 1
        elif inspect.isfunction(raw):
            fn, skip = raw, 1
        else:
            continue  # constants, nested classes, properties: not called by the engine
        hook = HOOKS.get(member)
        if hook is None:
            close = difflib.get_close_matches(member, HOOKS, n=1)
            hint = f"; did you mean {close[0]}()?" if close else ""
            raise PluginError(
                f"{where}: public method {member}() is not a hook of the engine{hint} (hooks: "
                f"{', '.join(sorted(HOOKS))}; a helper's name starts with an underscore)"
            )
        protocol, wanted = hook
        want_required, _, _ = _arity(wanted, skip=1)
        required, most, keyword_only = _arity(inspect.signature(fn), skip=skip)
        if required > want_required or most < want_required or keyword_only:
            expected = str(wanted).replace("(self, ", "(", 1)
            raise PluginError(
                f"{where}: {member}{inspect.signature(fn)} does not take the arguments of "
                f"{protocol.__name__}.{member}{expected}"
            )
    halves = [m for m in _methods(ModelRestrictionHook) if callable(getattr(cls, m, None))]
    if halves and len(halves) != len(_methods(ModelRestrictionHook)):
        missing = sorted(set(_methods(ModelRestrictionHook)) - set(halves))
        raise PluginError(
            f"{where}: defines {halves[0]}() but not {', '.join(m + '()' for m in missing)}; "
            "ModelRestrictionHook needs both"
        )
    if not any(implements(cls, point.protocol) for point in EXTENSION_POINTS.values()):
        methods = ", ".join(f"{next(iter(_methods(p.protocol)))}()" for p in EXTENSION_POINTS.values())
        raise PluginError(f"{where}: implements no extension point (it needs one of {methods})")


def check_extension_point(profile: str, field: str, plugin: str, cls: type) -> None:
    """Refuse a profile naming a plugin under an extension point whose protocol the plugin does not implement."""
    point = EXTENSION_POINTS[field]
    if not implements(cls, point.protocol):
        missing = ", ".join(f"{m}()" for m in _methods(point.protocol) if not callable(getattr(cls, m, None)))
        raise PluginError(
            f"profile {profile!r} names plugin {plugin!r} under {field}, but {_where(cls)} does not implement "
            f"{point.protocol.__name__} (it has no {missing})"
        )
