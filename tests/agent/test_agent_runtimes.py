"""The container runtimes' command lines, as the supervisor runs them (no runtime needed): what a job in an image is
given, and what it is not (no secret on a command line, none of the host but its mounts)."""

from __future__ import annotations

import pytest

from agent.containers import Apptainer, ContainerError, ContainerRun, Mount, Podman, runtime_for

RUN = ContainerRun(
    name="tessera-7_1-abcd1234",
    image="nvcr.io/nvidia/pytorch:24.05-py3",
    argv=("/bin/sh", "-c", "python train.py"),
    env_names=("JUPYTER_TOKEN", "TESSERA_JOB_ID"),
    workdir="/jobs/7/1/work",
    mounts=(Mount("/srv/datasets", "/datasets", True), Mount("/jobs/7/1/work", "/jobs/7/1/work", False)),
    user=(60001, 60001),
    network="none",
    cdi_devices=("nvidia.com/gpu=2",),
    cgroup_parent="/tessera/7_1",
)


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_podman_runs_the_job_as_its_user_in_its_cgroup_with_only_its_mounts_cards_and_no_network():
    argv = Podman("/usr/bin/podman", oci_runtime="runc").run_argv(RUN)
    assert argv[:4] == ["/usr/bin/podman", "--runtime", "runc", "run"]
    assert argv[-4:] == ["nvcr.io/nvidia/pytorch:24.05-py3", "/bin/sh", "-c", "python train.py"]
    assert _pairs(argv, "--user") == ["60001:60001"] and _pairs(argv, "--network") == ["none"]
    assert _pairs(argv, "--cgroup-parent") == ["/tessera/7_1"] and _pairs(argv, "--device") == [
        "nvidia.com/gpu=2"
    ]
    assert _pairs(argv, "--volume") == ["/srv/datasets:/datasets:ro", "/jobs/7/1/work:/jobs/7/1/work:rw"]
    assert _pairs(argv, "--env") == [
        "JUPYTER_TOKEN",
        "TESSERA_JOB_ID",
    ]  # values from the client's environment
    assert "--rm" in argv and "--init" in argv and _pairs(argv, "--cap-drop") == ["all"]
    assert _pairs(argv, "--pull") == ["never"]  # the supervisor pulled first, as the node's policy says
    nproc = next(u for u in _pairs(argv, "--ulimit") if u.startswith("nproc="))
    assert all(int(n) <= 32768 for n in nproc.removeprefix("nproc=").split(":"))
    open_run = Podman("/usr/bin/podman").run_argv(ContainerRun(**{**RUN.__dict__, "network": "cluster"}))
    assert _pairs(open_run, "--network") == ["host"] and "--runtime" not in open_run


def test_apptainer_binds_only_the_mounts_and_hands_the_variables_in_its_own_way():
    runtime = Apptainer("/usr/bin/apptainer")
    argv = runtime.run_argv(RUN)
    assert argv[:6] == ["/usr/bin/apptainer", "exec", "--containall", "--cleanenv", "--no-home", "--pwd"]
    assert argv[-4:] == ["docker://nvcr.io/nvidia/pytorch:24.05-py3", "/bin/sh", "-c", "python train.py"]
    assert _pairs(argv, "--bind") == ["/srv/datasets:/datasets:ro", "/jobs/7/1/work:/jobs/7/1/work:rw"]
    assert "--nv" in argv and _pairs(argv, "--network") == ["none"] and "--net" in argv
    env = runtime.client_env(
        {"JUPYTER_TOKEN": "s3cret", "TESSERA_JOB_ID": "7", "PATH": "/usr/bin"}, RUN.env_names
    )
    assert env == {
        "APPTAINERENV_JUPYTER_TOKEN": "s3cret",
        "APPTAINERENV_TESSERA_JOB_ID": "7",
        "PATH": "/usr/bin",
    }
    assert "s3cret" not in " ".join(argv)
    assert not runtime.sets_user and Podman("/usr/bin/podman").sets_user


def test_the_runtime_setting_is_checked(tmp_path):
    empty = str(tmp_path)  # a PATH with no runtime on it
    assert runtime_for("auto", path=empty) is None and runtime_for("none") is None
    with pytest.raises(ContainerError, match="no podman is on this node's PATH"):
        runtime_for("podman", path=empty)
    with pytest.raises(ContainerError, match="must be auto, none, podman, apptainer, enroot"):
        runtime_for("docker")
    with pytest.raises(ContainerError, match="enroot is detected and reported"):
        runtime_for("enroot")
    with pytest.raises(ContainerError, match="pull policy must be one of"):
        Podman("/usr/bin/podman").pull_plan("img", "sometimes")
