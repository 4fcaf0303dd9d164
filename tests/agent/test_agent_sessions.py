"""A job's web ports on its node: each given as asked where the port is free, another one where it is not (another
placement's, or anything listening), told to the job as TESSERA_PORT_<NAME>, and reported to the portal with the
ones that answer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from agent_test_helpers import wait_for

from agent import procfs, protocol, runtime
from agent.backends.sim import SimBackend
from agent.executor import Executor
from agent.jobspec import JobSpec
from agent.launch import ports_choose


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _spec(job_id: str, command, ports) -> JobSpec:
    return JobSpec.from_dict(
        {
            "job_id": job_id,
            "attempt": 1,
            "command": command,
            "gpus": [{"uuid": "GPU-sim-0", "index": 0}],
            "ports": [{"name": n, "port": p} for n, p in ports],
        }
    )


def test_a_free_port_is_given_as_asked_and_a_taken_one_is_moved():
    wanted = _free_port()
    spec = _spec("1", "true", [("jupyter", wanted), ("board", wanted + 1 if wanted < 65535 else wanted - 1)])
    assert ports_choose(spec, taken=set())["jupyter"] == wanted
    moved = ports_choose(spec, taken={wanted})  # another placement of this agent holds it
    assert moved["jupyter"] != wanted and len(set(moved.values())) == 2
    with socket.socket() as listening:  # something else on the host listens there
        listening.bind(("0.0.0.0", wanted))
        listening.listen()
        assert ports_choose(spec, taken=set())["jupyter"] != wanted


def test_the_wire_spec_keeps_ports_and_refuses_bad_ones():
    spec = _spec("1", "true", [("jupyter", 8888)])
    assert JobSpec.from_dict(spec.to_dict()) == spec and spec.ports == (("jupyter", 8888),)
    assert "ports" not in _spec("2", "true", []).to_dict()  # as an agent from before sessions wrote it
    with pytest.raises(ValueError, match="a web port"):
        _spec("3", "true", [("jupyter", 80)])


def test_the_job_listens_where_it_is_told_and_the_portal_hears_when_it_answers(tmp_path):
    agent = runtime.Agent(
        node_name="n1",
        backend=SimBackend({"node": "n1", "gpus": [{"model": "Sim", "count": 1, "memory_mib": 40960}]}),
        executor=Executor(tmp_path),
    )
    asked = _free_port()
    with socket.socket() as squatter:  # the port it asks for is taken on this host
        squatter.bind(("0.0.0.0", asked))
        squatter.listen()
        serve = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1"]
        # http.server takes its port as its last argument: the job reads it from its environment.
        command = f'exec {" ".join(serve)} "$TESSERA_PORT_WEB_UI"'
        handle = agent.executor.start(_spec("7", command, [("web-ui", asked)]))
        try:
            given = handle.ports["web-ui"]
            assert given != asked
            news: list[dict] = []

            def reported_ready() -> bool:
                news.extend(
                    m["payload"]
                    for m in agent.tick()
                    if m["type"] == "event" and m["payload"]["kind"] == "ports"
                )
                return bool(news and news[-1]["ready"])

            wait_for(
                "the agent to report the job's port answering", reported_ready, timeout_s=20, interval_s=0.2
            )
            assert news[0] == {
                "kind": "ports",
                "job_id": "7",
                "attempt": 1,
                "ports": {"web-ui": given},
                "ready": [],
            }
            assert news[-1]["ready"] == ["web-ui"], news
            assert [m for m in agent.tick() if m["type"] == "event" and m["payload"]["kind"] == "ports"] == []
            assert all(protocol.message("event", n)["type"] == "event" for n in news)
        finally:
            agent.executor.stop(handle.key, reason="not_desired", grace_s=1)
            agent.executor.wait(handle.key, 10)


def test_a_port_is_the_jobs_only_while_its_own_processes_listen_there():
    """Another job that takes the port (first, or after the job's server died) is not the job's server: the
    agent does not say the port answers, so the proxy's token never goes to it."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        inodes = procfs.listening_inodes(listening.getsockname()[1])
        assert inodes and procfs.holds_socket([os.getpid()], inodes) is True
        other = subprocess.Popen(["sleep", "30"])
        try:
            assert procfs.holds_socket([other.pid], inodes) is False
        finally:
            other.kill()
            other.wait()
    assert procfs.listening_inodes(_free_port()) == set()
