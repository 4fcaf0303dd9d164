"""Interactive sessions (scheduling/jobs/sessions.py): web ports in the spec, what the agent is told, where the
agent says they listen, and who may open them."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from scheduling.agents.reports.job_status import job_report
from scheduling.agents.reports.node_events import node_event
from scheduling.cycle import runner
from scheduling.cycle.desired_state import desired_jobs
from scheduling.jobs.documents import SpecError
from scheduling.jobs.models import JobEvent
from scheduling.jobs.sessions import (
    job_sessions_for,
    session_job_for,
    session_share,
    session_target,
)
from scheduling.jobs.spec import spec_from_mapping, spec_to_mapping
from scheduling.jobs.submit import job_spec_of, job_submit

pytestmark = pytest.mark.django_db


def submit(user, team, **spec):
    mapping = {"name": "notebook", "command": "jupyter lab", "gpus": 1, "ports": "jupyter:8888", **spec}
    return job_submit(submitter=user, team=team, spec=spec_from_mapping(mapping).spec)


@pytest.mark.parametrize(
    ("ports", "said"),
    [
        ("jupyter:80", "ports must be at least 1024 (got 80)"),
        ("jupyter:70000", "ports must be at most 65535 (got 70000)"),
        ("Jupyter:8888", "a name is a lower-case word"),
        ("jupyter:8888,jupyter:8889", "ports gives the name 'jupyter' twice"),
        ("a:9000,b:9000", "ports gives the port 9000 twice"),
        (8888, "ports is name:port joined by commas"),
        ([{"name": "a"}], "each item is name:port or {name, port}"),
        (",".join(f"p{i}:{9000 + i}" for i in range(9)), "ports may list at most 8 ports (got 9)"),
    ],
)
def test_bad_ports_are_refused_naming_the_field_and_the_limit(ports, said):
    with pytest.raises(SpecError) as refused:
        spec_from_mapping({"name": "n", "command": "c", "gpus": 1, "ports": ports})
    assert refused.value.field == "ports" and said in refused.value.message, refused.value.message


def test_ports_read_in_both_forms_and_written_back_as_a_list():
    text = spec_from_mapping({"name": "n", "command": "c", "gpus": 1, "ports": "jupyter:8888, tb:6006"}).spec
    listed = spec_from_mapping(
        {
            "name": "n",
            "command": "c",
            "gpus": 1,
            "kind": "interactive",
            "ports": [{"name": "jupyter", "port": 8888}, {"name": "tb", "port": "6006"}],
        }
    ).spec
    assert text.ports == listed.ports == (("jupyter", 8888), ("tb", 6006))
    assert (text.kind, listed.kind) == ("batch", "interactive")
    assert spec_to_mapping(listed)["ports"] == [
        {"name": "jupyter", "port": 8888},
        {"name": "tb", "port": 6006},
    ]
    with pytest.raises(SpecError, match="an array's tasks cannot share them"):
        spec_from_mapping({"name": "n", "command": "c", "gpus": 1, "ports": "a:9000", "array": "0-3"})


def test_a_job_with_ports_gets_its_own_secret_and_submits_again_as_it_was(alice, teams, node):
    one, two = submit(alice, teams["training"], kind="interactive"), submit(alice, teams["training"])
    assert len(one.session_token) >= 40 and one.session_token != two.session_token
    again = job_spec_of(one)
    assert (again.kind, again.ports) == ("interactive", (("jupyter", 8888),))
    plain = job_submit(
        submitter=alice,
        team=teams["training"],
        spec=spec_from_mapping({"name": "b", "command": "c", "gpus": 1}).spec,
    )
    assert plain.session_token == "" and plain.ports == []


def test_only_the_owner_opens_it_and_the_team_once_shared(alice, carol, bob, admin_user, teams, node):
    job = submit(alice, teams["training"])
    opens = lambda user: session_job_for(user=user, job_id=job.pk, name="jupyter") is not None  # noqa: E731
    assert opens(alice)
    assert not opens(carol)  # alice's team, even its admin: not shared
    assert (
        not opens(bob) and not opens(admin_user) and not opens(AnonymousUser())
    )  # staff too: it runs as alice
    assert session_job_for(user=alice, job_id=job.pk, name="tensorboard") is None  # no such port
    with pytest.raises(Exception, match="Only the job's submitter"):
        session_share(user=carol, job_id=job.pk, shared=True)
    session_share(user=alice, job_id=job.pk, shared=True)
    job.refresh_from_db()  # as the page reads it
    assert opens(carol) and not opens(bob) and not opens(admin_user)
    assert [link.state for link in job_sessions_for(user=carol, job=job)] == ["waiting"]
    assert job_sessions_for(user=bob, job=job) == []


def test_the_agent_is_told_the_ports_their_paths_and_the_secret_and_its_word_is_recorded(alice, teams, node):
    job = submit(alice, teams["training"], ports="jupyter:8888,board:6006")
    runner.cycle_run_once()
    job.refresh_from_db()
    entry = next(e for e in desired_jobs(node=node) if e["job_id"] == str(job.pk))
    assert entry["ports"] == [{"name": "jupyter", "port": 8888}, {"name": "board", "port": 6006}]
    assert entry["env"]["TESSERA_BASE_URL_JUPYTER"] == f"/jobs/{job.pk}/open/jupyter/"
    assert entry["env"]["TESSERA_BASE_URL_BOARD"] == f"/jobs/{job.pk}/open/board/"
    assert entry["env"]["JUPYTER_TOKEN"] == entry["env"]["TESSERA_SESSION_TOKEN"] == job.session_token
    assert session_target(job=job, name="jupyter").unavailable.endswith("has not started yet (placed).")

    started = {"job_id": str(job.pk), "attempt": job.attempt, "state": "started", "pid": 42}
    assert job_report(node_id=node.pk, payload=started).ok
    job.refresh_from_db()
    assert "has not said where jupyter listens" in session_target(job=job, name="jupyter").unavailable

    said = {"kind": "ports", "job_id": str(job.pk), "attempt": job.attempt}
    # The port it asked for was taken on the node: the agent gave another; a port never asked for is ignored.
    ports = {"jupyter": 40001, "board": 6006, "other": 5000}
    assert node_event(node_id=node.pk, payload={**said, "ports": ports, "ready": []}, message_id="m1").ok
    job.refresh_from_db()
    node.address = "10.0.3.7"
    node.save()
    target = session_target(job=job, name="jupyter")
    assert (target.address, target.port, target.ready, target.token) == (
        "10.0.3.7",
        40001,
        False,
        job.session_token,
    )
    assert [link.state for link in job_sessions_for(user=alice, job=job)] == ["starting", "starting"]
    assert not JobEvent.objects.filter(job=job, code="port_ready").exists()

    ports.pop("other")
    assert node_event(
        node_id=node.pk, payload={**said, "ports": ports, "ready": ["jupyter"]}, message_id="m2"
    ).ok
    assert node_event(
        node_id=node.pk, payload={**said, "ports": ports, "ready": ["jupyter"]}, message_id="m2"
    ).ok
    job.refresh_from_db()
    assert session_target(job=job, name="jupyter").ready
    assert [link.state for link in job_sessions_for(user=alice, job=job)] == ["ready", "starting"]
    ready = list(JobEvent.objects.filter(job=job, code="port_ready").values_list("message", flat=True))
    assert ready == ["jupyter answers on a100-01 (port 40001): open it from the job's page."]

    stale = node_event(node_id=node.pk, payload={**said, "attempt": job.attempt - 1, "ports": ports})
    assert not stale.ok and stale.stale


@pytest.mark.parametrize(
    ("address", "allow_loopback", "networks", "reached"),
    [
        ("10.0.3.7", False, [], "10.0.3.7"),
        ("169.254.169.254", False, [], None),  # a cloud's metadata service
        ("127.0.0.1", False, [], None),  # the portal's own host
        ("127.0.0.1", True, [], "127.0.0.1"),  # the demo's nodes
        ("::ffff:169.254.169.254", False, [], None),
        ("0.0.0.0", False, [], None),
        ("10.0.3.7", False, ["10.1.0.0/16"], None),
        ("10.1.2.3", False, ["10.1.0.0/16"], "10.1.2.3"),
        ("no-such-host.invalid", False, [], None),
    ],
)
def test_a_node_cannot_point_the_proxy_anywhere(
    alice, teams, node, settings, address, allow_loopback, networks, reached
):
    """A node's agent names its address: the proxy goes only where sessions may (TESSERA_SESSION_NETWORKS), never
    to link-local, loopback (unless allowed) or an address that does not resolve."""
    settings.TESSERA_SESSION_ALLOW_LOOPBACK = allow_loopback
    settings.TESSERA_SESSION_NETWORKS = networks
    job = submit(alice, teams["training"])
    runner.cycle_run_once()
    job.refresh_from_db()
    started = {"job_id": str(job.pk), "attempt": job.attempt, "state": "started"}
    assert job_report(node_id=node.pk, payload=started).ok
    said = {"kind": "ports", "job_id": str(job.pk), "attempt": job.attempt, "ports": {"jupyter": 8888}}
    assert node_event(node_id=node.pk, payload=said).ok
    node.address = address
    node.save()
    job.refresh_from_db()
    target = session_target(job=job, name="jupyter")
    if reached is None:
        assert "is not at an address sessions may use" in target.unavailable and target.unreachable
        assert not target.address
    else:
        assert (target.address, target.unavailable) == (reached, "")
