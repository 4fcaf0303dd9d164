"""Jobs in images, on the portal's side: a team's allowed images and mounts decide what may be submitted (refusals
name the list), an admin's changes are in the team's audit trail, and the agent is told the image, the mounts as
the team has them, and the stricter of the team's and the class's network."""

from __future__ import annotations

import pytest

from quotas.choices import network_strictest
from quotas.models import PriorityClass, QuotaChange, TeamMount
from quotas.selectors import image_allowed
from quotas.services import team_images_save, team_mount_delete, team_mount_save
from scheduling.agents.reports.job_status import job_report
from scheduling.agents.reports.node_events import node_event
from scheduling.cycle import runner
from scheduling.cycle.desired_state import desired_jobs
from scheduling.errors import ServiceError
from scheduling.jobs.documents import SpecError
from scheduling.jobs.models import JobEvent
from scheduling.jobs.spec import spec_from_mapping, spec_to_mapping
from scheduling.jobs.submit import job_spec_of, job_submit

pytestmark = pytest.mark.django_db
IMAGE = "nvcr.io/nvidia/pytorch:24.05-py3"


def submit(user, team, **spec):
    mapping = {"name": "train", "command": "python train.py", "gpus": 1, "image": IMAGE, **spec}
    return job_submit(submitter=user, team=team, spec=spec_from_mapping(mapping).spec)


@pytest.mark.parametrize(
    ("spec", "field", "said"),
    [
        ({"image": "pytorch latest"}, "image", "image must be an image reference"),
        ({"image": "-v/etc:/etc"}, "image", "starting with a letter or digit"),
        ({"image": "x" * 513}, "image", "image must be at most 512 characters (got 513)"),
        ({"mounts": "Datasets"}, "mounts", "a name is a lower-case word"),
        ({"mounts": "a,a"}, "mounts", "mounts names 'a' twice"),
        ({"mounts": ",".join(f"m{i}" for i in range(17))}, "mounts", "mounts may name at most 16 (got 17)"),
        ({"image": "", "mounts": "datasets"}, "mounts", "mounts are for a job in an image"),
    ],
)
def test_bad_images_and_mounts_are_refused_naming_the_field(spec, field, said):
    with pytest.raises(SpecError) as refused:
        spec_from_mapping({"name": "t", "command": "x", "gpus": 1, "image": IMAGE, **spec})
    assert refused.value.field == field and said in refused.value.message


def test_image_patterns_match_as_globs_and_an_empty_list_allows_any():
    assert image_allowed(IMAGE, ["nvcr.io/nvidia/*"]) and image_allowed(IMAGE, [])
    assert not image_allowed("docker.io/library/python:3.12", ["nvcr.io/nvidia/*", "registry.example.org/*"])
    assert network_strictest("open", "none") == "none" and network_strictest("", "cluster") == "cluster"
    assert network_strictest("", "") == "open"


def test_submit_refuses_an_image_outside_the_teams_list_and_a_mount_it_lacks(alice, admin_user, teams, node):
    org, training = teams["org"], teams["training"]
    org.allowed_images = "nvcr.io/nvidia/*\nregistry.example.org/ai-lab/*"
    team_images_save(team=org, actor=admin_user)
    with pytest.raises(ServiceError) as refused:
        submit(alice, training, image="docker.io/library/python:3.12")
    assert refused.value.field == "image" and refused.value.code == "image_not_allowed"
    assert (
        "not one of team ai-lab/training's allowed images (nvcr.io/nvidia/*, registry.example.org/ai-lab/*)"
        in (refused.value.message)
    )
    team_mount_save(
        mount=TeamMount(team=org, name="datasets", host_path="/srv/datasets", container_path="/datasets"),
        actor=admin_user,
    )
    with pytest.raises(ServiceError) as refused:
        submit(alice, training, mounts="datasets,scratch")
    assert refused.value.field == "mounts" and refused.value.code == "unknown_mount"
    assert refused.value.message == "Team ai-lab/training has no mount named scratch (its mounts: datasets)."
    job = submit(alice, training, mounts="datasets")  # the organisation's list and mount hold for its team
    assert (job.image, job.mounts) == (IMAGE, ["datasets"])
    again = job_spec_of(job)
    assert again.image == IMAGE and again.mounts == ("datasets",)
    assert spec_to_mapping(again)["image"] == IMAGE and spec_to_mapping(again)["mounts"] == ["datasets"]


def test_an_admins_changes_to_images_network_and_mounts_are_audited(admin_user, teams):
    team = teams["training"]
    before = QuotaChange.objects.filter(team=team).count()
    team.allowed_images, team.network = "nvcr.io/nvidia/*", "none"
    change = team_images_save(team=team, actor=admin_user)
    assert change.changes == {
        "allowed_images": {"old": None, "new": "nvcr.io/nvidia/*"},
        "network": {"old": None, "new": "none"},
    }
    assert team_images_save(team=team, actor=admin_user) is None  # nothing changed: nothing recorded
    mount = TeamMount(
        team=team, name="data", host_path="/data/training", container_path="/data", read_only=False
    )
    added = team_mount_save(mount=mount, actor=admin_user)
    assert added.changes == {"mount data": {"old": None, "new": "/data/training → /data (read-write)"}}
    mount.read_only = True
    changed = team_mount_save(mount=mount, actor=admin_user)
    assert changed.changes["mount data"]["new"] == "/data/training → /data (read-only)"
    removed = team_mount_delete(mount=mount, actor=admin_user)
    assert removed.changes == {"mount data": {"old": "/data/training → /data (read-only)", "new": None}}
    assert QuotaChange.objects.filter(team=team).count() == before + 4
    with pytest.raises(Exception, match="mount elsewhere"):
        team_mount_save(
            mount=TeamMount(team=team, name="etc", host_path="/srv/x", container_path="/etc"),
            actor=admin_user,
        )


def test_the_agent_is_told_the_image_its_mounts_and_the_stricter_network(alice, admin_user, teams, node):
    training = teams["training"]
    team_mount_save(
        mount=TeamMount(
            team=teams["org"], name="datasets", host_path="/srv/datasets", container_path="/datasets"
        ),
        actor=admin_user,
    )
    team_mount_save(  # the team's own of the same name wins over its organisation's
        mount=TeamMount(
            team=training, name="datasets", host_path="/srv/training-data", container_path="/datasets"
        ),
        actor=admin_user,
    )
    training.network = "cluster"
    team_images_save(team=training, actor=admin_user)
    job = submit(alice, training, mounts="datasets")
    bare = submit(alice, training, image="", name="bare")
    runner.cycle_run_once()
    entries = {e["job_id"]: e for e in desired_jobs(node=node)}
    entry = entries[str(job.pk)]
    assert entry["image"] == IMAGE and entry["network"] == "cluster"
    assert entry["mounts"] == [
        {"host_path": "/srv/training-data", "container_path": "/datasets", "read_only": True}
    ]
    assert not {"image", "mounts", "network"} & set(entries[str(bare.pk)])
    PriorityClass.objects.filter(pk=job.priority_class_id).update(network="none")
    runner.cycle_run_once()
    assert next(e for e in desired_jobs(node=node) if e["job_id"] == str(job.pk))["network"] == "none"


def test_the_image_pull_is_on_the_jobs_timeline_and_a_failed_pull_ends_it_with_the_runtimes_words(
    alice, teams, node
):
    job, other = submit(alice, teams["training"]), submit(alice, teams["training"], name="other")
    runner.cycle_run_once()
    for j in (job, other):
        j.refresh_from_db()
        assert job_report(
            node_id=node.pk, payload={"job_id": str(j.pk), "attempt": j.attempt, "state": "started"}
        ).ok
    said = {"kind": "image_ready", "job_id": str(job.pk), "attempt": job.attempt, "image": IMAGE}
    assert node_event(node_id=node.pk, payload={**said, "pull_s": 12.5, "pulled": True}, message_id="p1").ok
    assert node_event(node_id=node.pk, payload={**said, "pull_s": 12.5, "pulled": True}, message_id="p1").ok
    for bad in ("NaN", float("inf"), -1, "soon"):  # refused, never stored (a JSON column holds no NaN)
        refused = node_event(
            node_id=node.pk, payload={**said, "pull_s": bad, "pulled": True}, message_id="p2"
        )
        assert not refused.ok and "pull_s is seconds" in refused.error
    events = JobEvent.objects.filter(job=job, code="image_ready")
    assert [e.message for e in events] == [f"Image {IMAGE} pulled on a100-01 in 12.5 s."]
    ended = {
        "job_id": str(other.pk),
        "attempt": other.attempt,
        "state": "launch_failed",
        "reason": f"image_pull_failed: cannot pull image {IMAGE}: manifest unknown",
    }
    assert job_report(node_id=node.pk, payload=ended).ok
    other.refresh_from_db()
    assert other.state == "failed"
    last = JobEvent.objects.filter(job=other).order_by("-pk").first()
    assert last.code == "image_pull_failed"
    assert (
        last.message
        == f"Its image could not be pulled on a100-01: cannot pull image {IMAGE}: manifest unknown."
    )
