"""A GPU sample from an agent, typed field by field: what a browser and the REST view may be shown."""

from __future__ import annotations

import math

from scheduling.agents.live_metrics import GPU_FIELDS, gpu_sample


def test_each_field_keeps_its_type_and_anything_else_is_none():
    raw = {
        "index": 3,
        "uuid": "GPU-" + "x" * 100,
        "util_pct": 55.126,
        "mem_util_pct": 7,  # an int where a float is expected: taken as the float
        "memory_used_mib": 20000.9,  # a float where an int is expected: its integer part
        "memory_total_mib": True,  # a bool is not a number here
        "power_w": math.nan,
        "temperature_c": math.inf,
        "sm_clock_mhz": 2**60,  # past what a JSON number holds exactly
        "ecc_uncorrected_volatile": "0",
        "health": 1,
        "processes": [{"pid": 1}],  # not a field of the sample
    }
    sample = gpu_sample(raw)
    assert list(sample) == list(GPU_FIELDS)
    assert sample == {
        "index": 3,
        "uuid": "GPU-" + "x" * 60,
        "util_pct": 55.13,
        "mem_util_pct": 7.0,
        "memory_used_mib": 20000,
        "memory_total_mib": None,
        "power_w": None,
        "temperature_c": None,
        "sm_clock_mhz": None,
        "ecc_uncorrected_volatile": None,
        "health": None,
    }
    assert type(sample["mem_util_pct"]) is float and type(sample["memory_used_mib"]) is int


def test_a_sample_missing_every_field_is_all_none():
    assert gpu_sample({}) == dict.fromkeys(GPU_FIELDS)
    assert gpu_sample({"util_pct": 10**400})["util_pct"] is None  # no float holds it
