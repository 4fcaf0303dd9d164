"""Tessera's placement engine: pure Python, no Django. `run_cycle(snapshot, profile) -> Decisions`."""

from scheduling.engine.cycle import run_cycle
from scheduling.engine.framework import CycleContext, Profile
from scheduling.engine.profiles import PROFILES, get_profile, register_profile

__all__ = ["CycleContext", "PROFILES", "Profile", "get_profile", "register_profile", "run_cycle"]
