"""The fields of a scenario document: sizes, durations, shares and CPU amounts with their units, and the shape
checks (a mapping, a list, known keys, a whole number) whose errors name the field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from scheduling.sim.scenario_types import ScenarioError

_MEM_UNITS = {"mib": 1, "mb": 1, "gib": 1024, "gb": 1024, "tib": 1024 * 1024, "tb": 1024 * 1024}
_TIME_UNITS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_memory_mib(value: Any, where: str) -> int:
    """An int is MiB; strings take MiB/GiB/TiB (GB and TB are read as GiB and TiB, as GPU vendors use them)."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: {value!r} is not a memory size")
    if isinstance(value, int | float):
        mib = value
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)?\s*", str(value))
        if not m or (m.group(2) or "mib").lower() not in _MEM_UNITS:
            raise ScenarioError(
                f"{where}: {value!r} is not a memory size (use a number of MiB, or MiB, GiB, TiB)"
            )
        mib = float(m.group(1)) * _MEM_UNITS[(m.group(2) or "mib").lower()]
    if mib <= 0:
        raise ScenarioError(f"{where}: memory must be positive, got {value!r}")
    return int(round(mib))


def parse_duration_s(value: Any, where: str, *, allow_zero: bool = True) -> float:
    """A number is seconds; strings take s, m, h, d (`90m`, `2h`, `1.5d`)."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: {value!r} is not a duration")
    if isinstance(value, int | float):
        s = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]+)?\s*", str(value))
        if not m or (m.group(2) or "s") not in _TIME_UNITS:
            raise ScenarioError(f"{where}: {value!r} is not a duration (use seconds, or 30s, 10m, 2h, 1d)")
        s = float(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]
    if s < 0 or (s == 0 and not allow_zero):
        raise ScenarioError(
            f"{where}: duration must be {'non-negative' if allow_zero else 'positive'}, got {value!r}"
        )
    return s


def parse_share_milli(value: Any, where: str) -> int:
    """A share of one card: `25%`, a fraction 0..1, or milli-GPU as an int above 1."""
    if isinstance(value, bool):
        raise ScenarioError(f"{where}: {value!r} is not a share")
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*%\s*", value)
        if not m:
            raise ScenarioError(f"{where}: {value!r} is not a share (use 25%, 0.25 or 250 milli)")
        milli = float(m.group(1)) * 10
    elif isinstance(value, int | float):
        milli = value * 1000 if value <= 1 else value
    else:
        raise ScenarioError(f"{where}: {value!r} is not a share")
    if not 0 < milli <= 1000:
        raise ScenarioError(f"{where}: a share must be above 0 and at most one whole card, got {value!r}")
    return int(round(milli))


def parse_cpu_milli(value: Any, where: str) -> int:
    """Cores as a number (`16`, `0.5`) or millicores as a string (`500m`)."""
    if isinstance(value, str) and value.strip().endswith("m"):
        try:
            milli = int(value.strip()[:-1])
        except ValueError:
            raise ScenarioError(f"{where}: {value!r} is not a CPU amount") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        milli = int(round(value * 1000))
    else:
        raise ScenarioError(f"{where}: {value!r} is not a CPU amount (cores, or millicores like 500m)")
    if milli < 0:
        raise ScenarioError(f"{where}: CPU must not be negative, got {value!r}")
    return milli


# --- shape checks ---------------------------------------------------------------------------------------------
def as_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def as_list(value: Any, where: str) -> list:
    if not isinstance(value, list):
        raise ScenarioError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def known_fields(d: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ScenarioError(
            f"{where}.{unknown[0]}: unknown field (expected one of {', '.join(sorted(allowed))})"
        )


def whole_number(value: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: expected a whole number, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where}: must be at least {minimum}, got {value}")
    return value
