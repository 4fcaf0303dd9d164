"""Jobs in container images with the host's real Podman (rootful, as the agent; CI runs as root): the image is
made here with `podman import` from Debian's busybox-static, no registry. Each job runs under its real supervisor
with the agent's isolation (a pool uid, cgroup limits), so what is checked is what a GPU host does. Skips, with the
reason, where this host has no Podman or the tests do not run as root."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
from agent_test_helpers import wait_for

from agent.containers import Mount, runtime_for
from agent.executor import Executor
from agent.isolation import Isolation
from agent.jobspec import Gang, GangMember, JobSpec
from agent.protocol import IMAGE_PULL_FAILED
from tests.support import busybox_image

POOL = (61100, 61119)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful Podman needs root (CI runs as root)"),
    pytest.mark.skipif(shutil.which("podman") is None, reason="no podman on this host (.ci/run installs it)"),
]


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image()


@pytest.fixture
def work():
    d = Path(tempfile.mkdtemp(prefix="tessera-images-", dir="/tmp"))
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _executor(work: Path, name: str = "agent") -> Executor:
    d = work / name
    d.mkdir()
    return Executor(
        d,
        isolation=Isolation(mode="pool", uid_pool=POOL),
        containers=runtime_for("podman"),
        python="/usr/bin/python3",
    )


def _ended(ex: Executor, key: str, timeout_s: float = 60.0):
    handle = wait_for(
        f"placement {key} to end",
        lambda: (ex.poll() or True) and (h := ex.handle(key)) is not None and not h.active and h,
        timeout_s=timeout_s,
    )
    return handle


def _output(ex: Executor, handle) -> str:
    return "\n".join(ex.tail_log(handle.key, "stdout", lines=200))


def test_a_job_runs_in_its_image_as_its_pool_uid_and_sees_only_what_it_was_given(image, work):
    shared = work / "datasets"
    shared.mkdir()
    (shared / "imagenet.txt").write_text("cats\n")
    os.chmod(shared, 0o755)
    os.chmod(shared / "imagenet.txt", 0o644)
    host_only = work / "host-only.txt"
    host_only.write_text("not for jobs\n")
    ex = _executor(work)
    spec = JobSpec(
        job_id="img-1",
        attempt=1,
        image=image,
        command="id -u; id -g; echo home=$HOME; cat /datasets/imagenet.txt; "
        f"test -e {host_only} && echo host-file-seen || echo host-file-hidden; "
        "echo x > /datasets/new.txt 2>/dev/null && echo wrote-dataset || echo dataset-read-only; "
        "echo scratch > $TMPDIR/s && cat $TMPDIR/s; ls /; echo secret=${TESSERA_JOB_ID}",
        mounts=(Mount(str(shared), "/datasets", read_only=True),),
    )
    handle = ex.start(spec)
    assert handle.outcome != "launch_failed", handle.detail
    handle = _ended(ex, spec.key)
    out = _output(ex, handle)
    assert handle.outcome == "exited" and handle.exit_code == 0, (out, ex.tail_log(spec.key, "stderr"))
    lines = out.splitlines()
    assert lines[0] == str(handle.uid) and POOL[0] <= int(lines[0]) <= POOL[1]
    assert lines[1] == str(handle.uid)  # its gid is its uid, as for a bare process
    assert f"home={handle.dir / 'work'}" in lines
    assert "cats" in lines and "host-file-hidden" in lines and "dataset-read-only" in lines
    assert "scratch" in lines and "secret=img-1" in lines
    assert "usr" not in lines and "bin" in lines  # the image's tree, not the host's
    assert not (handle.dir / "tmp").exists()  # the per-job scratch is gone with the job
    run = json.loads((handle.dir / "run.json").read_text())
    name = run["container"]["name"]
    assert name.startswith("tessera-img-1_1-")
    assert subprocess.run(["podman", "container", "exists", name], check=False).returncode == 1  # removed
    pulled = json.loads((handle.dir / "pull.json").read_text())
    assert pulled["ok"] and pulled["present"] and not pulled["pulled"]


def test_its_memory_limit_kills_it_and_says_so(image, work):
    ex = _executor(work)
    spec = JobSpec(
        job_id="img-oom",
        attempt=1,
        image=image,
        memory_mib=48,
        command='x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; while true; do x="$x$x"; done',
    )
    ex.start(spec)
    handle = _ended(ex, spec.key)
    assert handle.outcome == "killed" and handle.stop_reason == "host_memory_exceeded", (
        handle.outcome,
        handle.detail,
        ex.tail_log(spec.key, "stderr"),
    )
    run = json.loads((handle.dir / "run.json").read_text())
    assert not any(
        os.path.exists(d) for d in run["cgroup"]["dirs"]
    )  # the runtime's cgroups went with the job's


def test_its_grace_reaches_the_process_inside(image, work):
    ex = _executor(work)
    spec = JobSpec(
        job_id="img-grace",
        attempt=1,
        image=image,
        grace_s=20,
        command="trap 'echo checkpointed; exit 0' TERM; echo ready; while true; do sleep 0.2; done",
    )
    ex.start(spec)
    wait_for("the job to say it is ready", lambda: "ready" in _output(ex, ex.handle(spec.key)))
    ex.stop(spec.key, reason="cancelled")
    handle = _ended(ex, spec.key)
    assert "checkpointed" in _output(ex, handle)
    assert handle.outcome == "stopped" and not handle.kill_sent  # it ended within its grace, on its own


def _listener() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    threading.Thread(target=lambda: [server.accept()[0].close() for _ in range(4)], daemon=True).start()
    return server, server.getsockname()[1]


@pytest.mark.parametrize(("network", "expected"), [("none", "unreachable"), ("open", "reached")])
def test_with_network_none_it_cannot_reach_the_hosts_loopback(image, work, network, expected):
    server, port = _listener()
    try:
        ex = _executor(work)
        spec = JobSpec(
            job_id=f"img-net-{network}",
            attempt=1,
            image=image,
            network=network,
            command=f"echo hi | nc -w 2 127.0.0.1 {port} && echo reached || echo unreachable",
        )
        ex.start(spec)
        handle = _ended(ex, spec.key)
        assert _output(ex, handle).splitlines()[-1] == expected
    finally:
        server.close()


def test_a_missing_image_ends_it_image_pull_failed_with_the_runtimes_words(work):
    ex = _executor(work)
    spec = JobSpec(
        job_id="img-missing", attempt=1, image="localhost/tessera-no-such-image:404", command="echo never"
    )
    ex.start(spec)
    handle = _ended(ex, spec.key)
    assert handle.outcome == "launch_failed"
    assert handle.detail.startswith(
        f"{IMAGE_PULL_FAILED}: cannot pull image localhost/tessera-no-such-image:404"
    )
    assert "never" not in _output(ex, handle)
    pulled = json.loads((handle.dir / "pull.json").read_text())
    assert not pulled["ok"] and pulled["pull_s"] >= 0


def test_a_two_task_gang_in_images_rendezvouses(image, work):
    port = _listener_free_port()
    members = (
        GangMember(node="a", address="127.0.0.1", slots=1),
        GangMember(node="b", address="127.0.0.1", slots=1),
    )
    # Rank 0 listens at MASTER_PORT until a line arrives; rank 1 tries until rank 0 listens.
    script = (
        'if [ "$NODE_RANK" = 0 ]; then line=; while [ -z "$line" ]; do line=$(nc -l -p "$MASTER_PORT"); done; '
        'echo "$line"; else for i in $(seq 1 150); do echo "hello from rank $NODE_RANK of $WORLD_SIZE" | '
        'nc "$MASTER_ADDR" "$MASTER_PORT" && break; sleep 0.2; done; fi; cat "$TESSERA_HOSTFILE"'
    )
    executors, specs = [], []
    for rank in (0, 1):
        ex = _executor(work, f"agent{rank}")
        spec = JobSpec(
            job_id="img-gang",
            attempt=1,
            image=image,
            command=script,
            gang=Gang(rank=rank, master_port=port, members=members),
        )
        ex.start(spec)
        executors.append(ex)
        specs.append(spec)
    ends = [_ended(ex, spec.key) for ex, spec in zip(executors, specs, strict=True)]
    rank0 = _output(executors[0], ends[0])
    assert "hello from rank 1 of 2" in rank0, (
        rank0,
        executors[0].tail_log(specs[0].key, "stderr"),
        _output(executors[1], ends[1]),
        executors[1].tail_log(specs[1].key, "stderr"),
    )
    assert all(h.exit_code == 0 for h in ends)


def _listener_free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_agent_tells_the_portal_once_when_the_image_is_ready(image, work):
    from agent import runtime
    from agent.backends.sim import SimBackend

    agent = runtime.Agent(
        node_name="n1",
        backend=SimBackend({"node": "n1", "gpus": [{"model": "Sim", "count": 1, "memory_mib": 40960}]}),
        executor=_executor(work),
    )
    spec = JobSpec(job_id="img-said", attempt=1, image=image, command="sleep 30", grace_s=0)
    agent.executor.start(spec)
    news: list[dict] = []

    def said() -> bool:
        news.extend(
            m["payload"]
            for m in agent.tick()
            if m["type"] == "event" and m["payload"]["kind"] == "image_ready"
        )
        return bool(news)

    try:
        wait_for("the agent to report the image ready", said, timeout_s=30, interval_s=0.2)
        assert news == [
            {
                "kind": "image_ready",
                "job_id": "img-said",
                "attempt": 1,
                "image": image,
                "pull_s": news[0]["pull_s"],
                "pulled": False,
            }
        ]
        assert isinstance(news[0]["pull_s"], float)
        assert not [m for m in agent.tick() if m["type"] == "event" and m["payload"]["kind"] == "image_ready"]
    finally:
        agent.executor.stop(spec.key, reason="test over", grace_s=0)
        _ended(agent.executor, spec.key)
