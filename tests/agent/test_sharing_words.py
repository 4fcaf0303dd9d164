"""The portal and the agent name the sharing modes with the same words: the desired state carries the portal's
word as it is, and the agent takes every one of them (and its own earlier `time_sliced`)."""

from __future__ import annotations

import pytest

from agent.backends.base import SHARING_MODES, sharing_mode
from agent.jobspec import GpuSlice
from scheduling.choices import SharingMode


def test_the_agent_takes_every_sharing_mode_the_portal_has_by_its_own_name() -> None:
    assert set(SHARING_MODES) == set(SharingMode.values)
    for mode in SharingMode.values:
        assert GpuSlice.from_dict({"uuid": "GPU-0", "index": 0, "sharing": mode}).sharing == mode


def test_the_agent_s_earlier_word_is_read_and_anything_else_refused_naming_the_modes() -> None:
    assert sharing_mode("time_sliced") == "timeslice"
    with pytest.raises(ValueError, match="exclusive, mps, timeslice, mig"):
        sharing_mode("timesliced")
