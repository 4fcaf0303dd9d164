"""The job spec is defined once (scheduling.jobs.fields): the reader, the API schema, the submit form and the CLI's
flags name the same fields, and the agent's job entry is the one the portal sends."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from decimal import Decimal

import pytest

from agent.jobspec import JobSpec as AgentJobSpec
from frontend.forms import JobForm
from portal.submit_flags import SUBMIT_FLAGS
from scheduling.cycle.desired_state import Card, InImage, Member, PlacedJob, _gang_entry, _job_entry
from scheduling.jobs import fields
from scheduling.jobs.api.spec_schema import JOB_SPEC_SCHEMA
from scheduling.jobs.documents import SpecError
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.spec import spec_from_mapping, spec_to_mapping

FORM_OWN = {"kind", "command_form", "interactive"}  # whole cards or a slice; argv or a shell line; a session


def test_every_jobspec_attribute_is_one_field_of_the_table():
    attrs = [f.attr for f in fields.FIELDS if f.attr]
    assert sorted(attrs) == sorted(a.name for a in dataclasses.fields(JobSpec))
    assert len(set(attrs)) == len(attrs)


def test_the_api_schema_names_every_field_and_alias_and_nothing_else():
    assert set(JOB_SPEC_SCHEMA["properties"]) == set(fields.FIELD) | set(fields.ALIAS)
    assert JOB_SPEC_SCHEMA["required"] == ["name", "command"] == list(fields.REQUIRED)


def test_the_form_shows_the_labelled_fields_under_the_specs_names():
    form = JobForm(allowances={}, models=["A100-80GB"])
    spec_fields = set(form.fields) - FORM_OWN
    assert spec_fields == {f.name for f in fields.FIELDS if f.label}
    assert spec_fields <= set(fields.FIELD)
    for name in spec_fields:
        assert form.fields[name].label == fields.FIELD[name].label


def test_the_cli_flags_set_fields_of_the_spec():
    assert {name for _, name, _ in SUBMIT_FLAGS} == {f.name for f in fields.FIELDS if f.flags}
    assert {name for _, name, _ in SUBMIT_FLAGS} <= set(fields.FIELD)


def test_tessera_submit_offers_every_flag_of_the_table():
    text = subprocess.run(
        [sys.executable, "-m", "cli", "submit", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for spec_field in fields.FIELDS:
        for flag in spec_field.flags:
            assert flag in text, f"{flag} ({spec_field.name}) is not in tessera submit --help"


def test_every_alias_names_a_field():
    for alias in fields.ALIASES:
        assert alias.field in fields.FIELD and alias.name not in fields.FIELD


RICH = {
    "name": "train",
    "team": "ml",
    "command": "python train.py --lr 3e-4",
    "env": {"SEED": "1"},
    "gpus": 2,
    "gpu_models": ["A100-80GB", "H100-80GB"],
    "min_gpu_memory": "40GiB",
    "min_compute_capability": "8.0",
    "topology": "nvlink",
    "nodes": 2,
    "cpu": "500m",
    "memory": "64GiB",
    "priority": "training",
    "preemptible": False,
    "max_runtime": "1h30m",
    "checkpoint_interval": "30m",
    "requeue_on_node_loss": False,
    "workdir": "/data/run1",
    "notify": "start,fail",
}


def test_the_written_form_reads_back_to_the_same_spec():
    parsed = spec_from_mapping(RICH)
    written = spec_to_mapping(parsed.spec, team=parsed.team)
    assert set(written) <= set(fields.FIELD)
    again = spec_from_mapping(written)
    assert again == parsed
    assert parsed.spec.min_compute_capability == Decimal("8.0") and parsed.spec.cpu_milli == 500


@pytest.mark.parametrize("alias", [a.name for a in fields.ALIASES])
def test_a_field_given_under_both_names_is_refused(alias):
    target = fields.ALIAS[alias].field
    value = 1024 if fields.ALIAS[alias].unit else RICH.get(target, "/data")
    with pytest.raises(SpecError) as refused:
        spec_from_mapping({**RICH, target: RICH.get(target, "/data"), alias: value})
    assert refused.value.field == target and "twice" in str(refused.value)


def _placed(**overrides) -> PlacedJob:
    values = dict(
        pk=17,
        attempt=2,
        name="train",
        command="python train.py",
        workdir="/data/run1",
        env={"SEED": 1},
        max_runtime_s=3600,
        grace_s=30,
        cpu_milli=4000,
        memory_mib=65536,
        user="alice",
        gpus=2,
        nodes=2,
        array_job_id=None,
        array_task_id=None,
        array_task_count=None,
        ports=[["jupyter", 8888]],
        session_token="secret",
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        mounts=["datasets"],
        team_id=3,
        class_network="",
    )
    return PlacedJob(**{**values, **overrides})


def test_the_agent_reads_every_key_of_the_job_entry_the_portal_sends():
    job = _placed()
    cards = [Card("GPU-a", 0, "exclusive", 81920, 100), Card("GPU-b", 1, "mps", 20480, 25)]
    members = [Member(0, 1, "gpu-07", "10.0.3.7", 29500), Member(1, 2, "gpu-08", "10.0.3.8", None)]
    in_image = InImage(
        mounts=[{"host_path": "/srv/datasets", "container_path": "/datasets", "read_only": True}],
        network="none",
    )
    entry = {**_job_entry(job, cards, in_image), "gang": _gang_entry(job, members, node_id=2)}

    agent_keys = {f.name for f in dataclasses.fields(AgentJobSpec)}
    assert set(entry) == agent_keys, "the portal and the agent disagree on the job entry's keys"
    spec = AgentJobSpec.from_dict(entry)
    assert (spec.job_id, spec.attempt, spec.name, spec.cwd, spec.user) == (
        "17",
        2,
        "train",
        "/data/run1",
        "alice",
    )
    assert spec.env["SEED"] == "1" and spec.env["TESSERA_ATTEMPT"] == "2"
    assert [(g.uuid, g.memory_mib, g.sharing) for g in spec.gpus] == [
        ("GPU-a", None, "exclusive"),
        ("GPU-b", 20480, "mps"),
    ]
    assert (spec.cpu_milli, spec.memory_mib, spec.max_runtime_s, spec.grace_s) == (4000, 65536, 3600.0, 30.0)
    assert spec.gang is not None and spec.gang.rank == 1 and spec.gang.master_port == 29500
    assert (
        spec.ports == (("jupyter", 8888),)
        and spec.env["TESSERA_BASE_URL_JUPYTER"] == "/jobs/17/open/jupyter/"
    )
    assert spec.image == "nvcr.io/nvidia/pytorch:24.05-py3" and spec.network == "none"
    assert [(m.host_path, m.container_path, m.read_only) for m in spec.mounts] == [
        ("/srv/datasets", "/datasets", True)
    ]
    assert AgentJobSpec.from_dict(spec.to_dict()) == spec
    # A job serving no web ports, on the node itself: the entry an agent from before sessions and images was sent,
    # key for key.
    plain = _job_entry(_placed(ports=[], session_token="", image="", mounts=[]), cards)
    assert "ports" not in plain and not any(k.startswith("TESSERA_BASE_URL") for k in plain["env"])
    assert not {"image", "mounts", "network"} & set(plain)
