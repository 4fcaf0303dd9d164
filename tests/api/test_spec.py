"""Job spec parsing: units, aliases, and refusals that name the field and the limit (no database)."""

from decimal import Decimal

import pytest

from scheduling.jobs.spec import (
    SpecError,
    parse_checkpoint_interval_s,
    parse_cpu_milli,
    parse_duration_s,
    parse_memory_mib,
    spec_from_mapping,
    spec_from_text,
    spec_to_mapping,
)


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("10GiB", 10240),
        ("512MiB", 512),
        ("80GB", 76294),
        ("1.5Gi", 1536),
        ("1TiB", 1024 * 1024),
        ("2048 Mi", 2048),
    ],
)
def test_it_reads_memory_sizes_with_units(text, mib):
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize("text", ["10", 10, "ten GiB", "10XB", "", True])
def test_it_refuses_a_memory_size_without_a_known_unit(text):
    with pytest.raises(SpecError) as caught:
        parse_memory_mib(text, field="gpu_memory")
    assert caught.value.field == "gpu_memory"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2h", 7200), ("30m", 1800), ("90s", 90), ("1h30m", 5400), (3600, 3600), ("1d", 86400)],
)
def test_it_reads_durations(text, seconds):
    assert parse_duration_s(text) == seconds


def test_it_refuses_a_runtime_over_a_year_naming_the_limit():
    with pytest.raises(SpecError) as caught:
        parse_duration_s("400d")
    assert caught.value.field == "max_runtime"
    assert caught.value.limit == 365 * 24 * 3600


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("30m", 1800), ("2h", 7200), ("1.1m", 66), (600, 600), (1800.0, 1800), ("1800", 1800)],
)
def test_it_reads_a_checkpoint_interval_as_whole_seconds(value, seconds):
    assert parse_checkpoint_interval_s(value) == seconds


@pytest.mark.parametrize(
    ("value", "limit", "words"),
    [
        ("30s", 60, "between 60 s (1m) and 604800 s (7d)"),
        (59, 60, "between 60 s (1m) and 604800 s (7d)"),
        ("8d", 604800, "between 60 s (1m) and 604800 s (7d)"),
        (10**30, 604800, "between 60 s (1m) and 604800 s (7d)"),
        (90.5, None, "a whole number of seconds"),
        ("1.5s", None, "a whole number of seconds"),
        ("often", None, "a duration such as"),
        (True, None, "a duration such as"),
    ],
)
def test_it_refuses_a_checkpoint_interval_out_of_range_or_not_whole_naming_the_limit(value, limit, words):
    with pytest.raises(SpecError) as caught:
        parse_checkpoint_interval_s(value, field="checkpoint_interval_s")
    assert (caught.value.field, caught.value.limit) == ("checkpoint_interval_s", limit)
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("text", "milli"), [("4", 4000), (4, 4000), ("500m", 500), (0.5, 500), ("2.5", 2500)]
)
def test_it_reads_cpu_as_cores_or_millicores(text, milli):
    assert parse_cpu_milli(text) == milli


def test_it_turns_a_yaml_spec_into_a_job_spec():
    parsed = spec_from_text(
        """
name: finetune
team: ai-lab/training
command: [python, train.py, --lr, "3e-4"]
env: {WANDB_MODE: offline, SEED: 7}
gpu_memory: 10GiB
compute_pct: 25
gpu_models: [A100-80GB]
min_compute_capability: 8.0
cpu: 500m
memory: 16GiB
priority: training
preemptible: true
max_runtime: 2h
"""
    )
    assert parsed.team == "ai-lab/training"
    spec = parsed.spec
    assert spec.command == "python train.py --lr 3e-4"
    assert spec.env == {"WANDB_MODE": "offline", "SEED": "7"}
    assert (spec.gpu_memory_mib, spec.compute_pct, spec.cpu_milli, spec.memory_mib) == (10240, 25, 500, 16384)
    assert spec.min_compute_capability == Decimal("8.0")
    assert spec.max_runtime_s == 7200
    assert spec.gpu_models == ("A100-80GB",)


def test_a_spec_round_trips_through_its_written_form():
    parsed = spec_from_mapping(
        {
            "name": "a",
            "command": "run",
            "gpus": 2,
            "topology": "nvlink",
            "memory": "64GiB",
            "max_runtime": "90m",
            "checkpoint_interval": "30m",
        }
    )
    assert spec_to_mapping(parsed.spec)["checkpoint_interval"] == "30m"
    again = spec_from_mapping(spec_to_mapping(parsed.spec))
    assert again.spec == parsed.spec


def test_unit_free_aliases_take_the_model_units():
    parsed = spec_from_mapping(
        {
            "name": "a",
            "command": "run",
            "gpu_memory_mib": 2048,
            "cpu_milli": 250,
            "checkpoint_interval_s": 900,
        }
    )
    assert (parsed.spec.gpu_memory_mib, parsed.spec.cpu_milli, parsed.spec.checkpoint_interval_s) == (
        2048,
        250,
        900,
    )


@pytest.mark.parametrize(("key", "value"), [("checkpoint_interval", 30), ("checkpoint_interval_s", "30s")])
def test_a_checkpoint_interval_refused_names_the_key_as_written(key, value):
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({"name": "a", "command": "run", "gpus": 1, key: value})
    assert (caught.value.field, caught.value.limit) == (key, 60)


@pytest.mark.parametrize(
    ("spec", "field", "limit"),
    [
        ({"compute_pct": 150}, "compute_pct", 100),
        ({"gpus": 10_000}, "gpus", 64),
        ({"gpus": 1, "nodes": 100_000}, "nodes", 256),
        ({"gpus": 1, "colour": "red"}, "colour", None),
        ({"gpus": 1, "topology": "ring"}, "topology", None),
        ({"gpus": 1, "env": {"1BAD": "x"}}, "env", None),
        ({}, "gpus", None),
        ({"gpus": 1, "name": "x" * 300}, "name", 200),
    ],
)
def test_it_refuses_bad_fields_naming_the_field_and_the_limit(spec, field, limit):
    spec = {"name": "job", "command": "run", **spec}
    with pytest.raises(SpecError) as caught:
        spec_from_mapping(spec)
    assert caught.value.field == field
    assert caught.value.limit == limit


def test_it_refuses_text_that_is_not_yaml():
    with pytest.raises(SpecError) as caught:
        spec_from_text("name: [unclosed")
    assert caught.value.field == "spec"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: a\ncommand: b\ngpus: 1\nmax_runtime: .nan\n", "max_runtime"),
        ("name: a\ncommand: b\ngpus: 1\nmax_runtime: -.inf\n", "max_runtime"),
        ("name: a\ncommand: b\ngpus: .inf\n", "gpus"),
        ("name: .nan\ncommand: b\ngpus: 1\n", "name"),
        ("name: a\ncommand: [run, .nan]\ngpus: 1\n", "command"),
        ("name: a\ncommand: b\ngpus: 1\nenv: {X: .inf}\n", "env"),
        ("name: a\ncommand: b\ngpus: 1\ncompute_pct: .nan\n", "compute_pct"),
        ("name: a\ncommand: b\ngpus: 1\ncpu: .nan\n", "cpu"),
        ('{"name": "a", "command": "b", "gpus": 1, "max_runtime": NaN}', "spec"),
        ('{"name": "a", "command": "b", "gpus": Infinity}', "spec"),
        ('{"name": "a", "command": "b", "gpus": -Infinity}', "spec"),
        ("name: a\ncommand: b\ngpus: " + "1" * 5000 + "\n", "spec"),
        ('{"name": "a", "command": "b", "gpus": ' + "1" * 5000 + "}", "spec"),
    ],
)
def test_it_refuses_non_finite_and_out_of_range_numbers_naming_the_field(text, field):
    with pytest.raises(SpecError) as caught:
        spec_from_text(text)
    assert caught.value.field == field


def test_it_reads_negative_zero_as_zero():
    parsed = spec_from_mapping({"name": "a", "command": "b", "gpus": 1, "compute_pct": -0.0})
    assert parsed.spec.compute_pct == 0


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"gpus": 10**5000}, "gpus"),
        ({"memory_mib": 10**5000}, "memory"),
        ({"cpu": 10**5000}, "cpu"),
        ({"max_runtime": 10**5000}, "max_runtime"),
        ({"min_compute_capability": 10**5000}, "min_compute_capability"),
        ({"name": 10**5000}, "name"),
        ({"env": {"SEED": 10**5000}}, "env"),
        ({"command": ["run", 10**5000]}, "command"),
        ({"gpus": 2**63}, "gpus"),
        ({"max_runtime": "1" * 400 + "d"}, "max_runtime"),
        ({"gpu_memory": "1" * 5000 + "GiB"}, "gpu_memory"),
        ({"max_runtime": -0.0}, "max_runtime"),
        ({"nodes": -0.0}, "nodes"),
    ],
)
def test_it_refuses_huge_integers_and_negative_zero_naming_the_field(extra, field):
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({"name": "a", "command": "b", "gpus": 1, **extra})
    assert caught.value.field == field
    assert len(str(caught.value)) < 300


def test_a_working_directory_must_be_an_absolute_path():
    from scheduling.jobs.spec import spec_to_mapping

    spec = spec_from_mapping({"name": "a", "command": "b", "gpus": 1, "cwd": "/data/run1"}).spec
    assert spec.workdir == "/data/run1" and spec_to_mapping(spec)["workdir"] == "/data/run1"
    with pytest.raises(SpecError, match="workdir must be an absolute path") as refused:
        spec_from_mapping({"name": "a", "command": "b", "gpus": 1, "workdir": "data/run1"})
    assert refused.value.field == "workdir"


@pytest.mark.parametrize(
    ("value", "words", "limit"),
    [
        ("-1", "gpus must be at least 0 (got -1).", 0),  # as a form sends it: once "must be a whole number"
        (-1, "gpus must be at least 0 (got -1).", 0),
        ("-" + "9" * 30, "gpus must be at least 0", 0),
        ("65", "gpus must be at most 64 (got 65).", 64),
        ("1.5", "gpus must be a whole number (got '1.5').", None),
        ("--1", "gpus must be a whole number (got '--1').", None),
    ],
)
def test_a_count_below_or_above_its_range_says_the_range_whatever_its_form(value, words, limit):
    with pytest.raises(SpecError) as caught:
        spec_from_mapping({"name": "a", "command": "b", "gpus": value})
    assert words in str(caught.value) and caught.value.limit == limit
