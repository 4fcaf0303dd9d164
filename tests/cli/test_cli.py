"""The `tessera` CLI as a subprocess against a live server: login, submit, queue, ls, show, cancel, logs,
usage, nodes, top; --json output and the exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.client import ExitCode
from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit
from scheduling.jobs.transitions import job_cancel

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cli(live_server, tmp_path):
    """Run `tessera ...` in a subprocess with its own config file; returns (exit code, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env["TESSERA_CONFIG"] = str(tmp_path / "config.json")

    def run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cli", *argv],
            input=stdin,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=60,
        )

    run.url = live_server.url
    run.config = tmp_path / "config.json"
    return run


@pytest.fixture
def logged_in(cli, alice, node):
    result = cli("login", "--url", cli.url, "--username", "alice", "--password-stdin", stdin="alice-pw\n")
    assert result.returncode == 0, result.stderr
    return cli


def test_login_saves_a_token_readable_only_by_its_owner(logged_in):
    saved = json.loads(logged_in.config.read_text())
    assert saved["username"] == "alice" and saved["token"].startswith("tsk_")
    assert oct(logged_in.config.stat().st_mode & 0o777) == "0o600"
    assert logged_in("whoami").stdout.startswith("alice")


def test_a_wrong_password_exits_not_logged_in(cli, alice, node):
    result = cli("login", "--url", cli.url, "--username", "alice", "--password-stdin", stdin="nope\n")
    assert result.returncode == ExitCode.NOT_LOGGED_IN
    assert "Wrong username or password" in result.stderr
    assert not cli.config.exists()


def test_commands_without_login_exit_not_logged_in(cli):
    result = cli("ls")
    assert result.returncode == ExitCode.NOT_LOGGED_IN
    assert "tessera login" in result.stderr


def test_the_first_job_in_three_commands_submit_ls_show_and_cancel(logged_in):
    example = ROOT / "docs/examples/notebook-slice.yaml"
    submitted = logged_in("submit", str(example), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert (job["state"], job["request"]["gpu_memory_mib"], job["request"]["compute_pct"]) == (
        "pending",
        10240,
        25,
    )

    listing = logged_in("ls")
    assert listing.returncode == 0
    assert listing.stdout.splitlines()[0].split()[:5] == ["JOBID", "NAME", "TEAM", "USER", "STATE"]
    row = listing.stdout.splitlines()[1].split()
    assert row[:6] == [str(job["id"]), "notebook", "ai-lab/training", "alice", "pending", "10GiB/25%"]

    shown = logged_in("show", str(job["id"]))
    assert "Why pending" in shown.stdout and "submitted" in shown.stdout

    queue = logged_in("queue", "--json")
    assert [e["id"] for e in json.loads(queue.stdout)] == [job["id"]]

    assert logged_in("cancel", str(job["id"])).returncode == 0
    again = logged_in("cancel", str(job["id"]))
    assert again.returncode == ExitCode.CONFLICT
    assert again.stderr.strip() == f"tessera cancel: Job {job['id']} is already cancelled."
    assert logged_in("ls", "--state", "cancelled", "--json").stdout.count('"id"') == 1


def test_submit_with_sbatch_like_flags_and_a_command(logged_in):
    result = logged_in(
        "submit",
        "-G",
        "2",
        "--topology",
        "nvlink",
        "-t",
        "2h",
        "--checkpoint-every",
        "30m",
        "-e",
        "SEED=1",
        "--json",
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert job["command"] == "python train.py --lr 3e-4"
    assert job["name"] == "train.py"  # the script, not the interpreter
    assert (job["request"]["gpus"], job["request"]["max_runtime_s"]) == (2, 7200)
    assert job["request"]["checkpoint_interval_s"] == 1800
    shown = logged_in("show", str(job["id"])).stdout.splitlines()
    assert ["Checkpoints", "every", "30m"] in [line.split() for line in shown]


def test_one_quoted_word_is_a_shell_line_and_separate_words_a_program_and_its_arguments(logged_in):
    quoted = logged_in("submit", "-G", "1", "--", "python train.py --lr 3e-4 && echo done")
    assert quoted.returncode == 0, quoted.stderr
    assert "run as a shell line" in quoted.stderr
    shown = logged_in("ls", "--json")
    line = next(j for j in json.loads(shown.stdout) if j["command"].startswith("python train.py"))
    assert line["command"] == "python train.py --lr 3e-4 && echo done"  # not quoted as one program name
    assert line["name"] == "train.py"  # a shell line too
    words = logged_in("submit", "-G", "1", "--json", "--", "echo", "a b", "$HOME")
    assert (
        json.loads(words.stdout)["command"] == "echo 'a b' '$HOME'"
    )  # exactly these words, nothing expanded


def test_a_script_with_tessera_lines_is_submitted_like_sbatch(logged_in):
    result = logged_in("submit", str(ROOT / "docs/examples/train.sh"), "--json")
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)
    assert (job["name"], job["request"]["gpus"], job["request"]["cpu_milli"]) == ("resnet-baseline", 1, 8000)
    assert job["command"].startswith("bash ") and job["command"].endswith("train.sh")


def test_a_spec_that_can_never_run_exits_invalid_naming_the_field(logged_in):
    result = logged_in("submit", "--gpu-memory", "96GiB", "--", "python", "x.py")
    assert result.returncode == ExitCode.INVALID
    assert "gpu_memory" in result.stderr and "81920MiB" in result.stderr


def test_a_class_the_team_may_not_use_exits_invalid_listing_the_classes_it_may(logged_in):
    result = logged_in("submit", "-G", "1", "-p", "critical", "--", "python", "x.py")
    assert result.returncode == ExitCode.INVALID
    assert (
        "team ai-lab/training may not use priority class critical; it may use: training, inference; default "
        "training." in result.stderr
    )


def test_a_job_beyond_the_teams_limit_exits_invalid_naming_the_field_and_the_limit(logged_in, teams):
    from quotas.models import Quota

    Quota.objects.filter(team=teams["training"]).update(guaranteed_gpus=2, limit_gpus=2)
    result = logged_in("submit", "-G", "4", "--", "python", "x.py")
    assert result.returncode == ExitCode.INVALID
    assert "gpus: this job needs 4 GPUs but team ai-lab/training may hold at most 2 GPUs (its limit)." in (
        result.stderr
    )


def test_another_teams_job_exits_not_found(logged_in, bob, teams, submit_as):
    job = submit_as(bob, teams["inference"])
    assert logged_in("show", str(job.pk)).returncode == ExitCode.NOT_FOUND
    assert logged_in("cancel", str(job.pk)).returncode == ExitCode.NOT_FOUND


def test_logs_prints_the_output_and_follow_stops_when_the_job_ends(
    logged_in, alice, teams, submit_as, settings, tmp_path
):
    from scheduling.agents import joblogs
    from scheduling.choices import JobState

    settings.TESSERA_LOG_DIR = str(tmp_path / "logs")
    job = submit_as(alice, teams["training"])
    joblogs.log_append(job_id=job.pk, stream="stdout", data="epoch 1\nepoch 2\n")
    assert logged_in("logs", str(job.pk)).stdout == "epoch 1\nepoch 2\n"
    assert logged_in("logs", str(job.pk), "--tail", "1").stdout == "epoch 2\n"
    assert job_cancel(job=job, actor=alice).state == JobState.CANCELLED
    followed = logged_in("logs", str(job.pk), "--follow", "--interval", "0.1")
    assert followed.returncode == 0 and followed.stdout == "epoch 1\nepoch 2\n"


def test_usage_nodes_and_top_once_print_tables(logged_in):
    usage = logged_in("usage")
    assert usage.returncode == 0 and "GPU_HOURS" in usage.stdout and "Total: 0.00 GPU-hours" in usage.stdout
    assert logged_in("usage", "--csv").stdout.strip() == "team,user,gpu_hours,gpu_memory_gib_hours,jobs"
    spaced = logged_in("usage", "--by", "team, user")  # as people type it
    assert spaced.returncode == 0 and "Total: 0.00 GPU-hours" in spaced.stdout, spaced.stderr
    from asgiref.sync import async_to_sync

    from scheduling.agents.live_metrics import live_metrics_store
    from tests.pipeline.harness import forget_live_metrics

    nodes = logged_in("nodes")
    assert nodes.returncode == 0 and "a100-01" in nodes.stdout and "8/8" not in nodes.stdout
    assert "AGENT" in nodes.stdout and "never connected" in nodes.stdout  # the node's conditions
    assert "UTIL" in nodes.stdout and "50%" not in nodes.stdout  # no agent sample yet: "-"
    sample = [{"index": 0, "util_pct": 40}, {"index": 1, "util_pct": 60}]
    async_to_sync(live_metrics_store)(node_name="a100-01", sampled_at=1.0, gpus=sample)
    try:
        assert "50%" in logged_in("nodes").stdout  # the mean of the GPUs with a fresh sample
    finally:
        forget_live_metrics("a100-01")
    top = logged_in("top", "--once")
    assert top.returncode == 0
    assert "tessera top" in top.stdout and "A100-80GB" in top.stdout and "ai-lab/training" in top.stdout
    assert json.loads(logged_in("top", "--json").stdout)["cluster"]["gpus"] == 8


def test_an_unreachable_server_exits_unavailable(cli, tmp_path):
    cli.config.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "tsk_x"}))
    assert cli("ls").returncode == ExitCode.UNAVAILABLE


def test_top_refreshes_in_a_terminal_and_quits_on_q(logged_in):
    import pty
    import select
    import time

    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env["TESSERA_CONFIG"] = str(logged_in.config)
    pid, fd = pty.fork()
    if pid == 0:  # the child: tessera top on a terminal
        os.chdir(ROOT)
        os.execve(sys.executable, [sys.executable, "-m", "cli", "top", "--interval", "0.3"], env)
    screen = b""
    deadline = time.time() + 30
    while screen.count(b"tessera top") < 2 and time.time() < deadline:  # at least one refresh
        if select.select([fd], [], [], 1)[0]:
            screen += os.read(fd, 65536)
    os.write(fd, b"q")
    while time.time() < deadline:  # keep draining so the child never blocks on a full terminal
        try:
            if select.select([fd], [], [], 1)[0] and not os.read(fd, 65536):
                break
        except OSError:  # the child closed the terminal: it has exited
            break
    _, status = os.waitpid(pid, 0)
    assert screen.count(b"tessera top") >= 2
    assert b"(q to quit)" in screen
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_reader_that_stops_early_ends_ls_and_nodes_quietly(logged_in, alice, teams, submit_as):
    """`tessera ls | head`: the reader has gone, so stop without a BrokenPipeError traceback."""
    submit_as(alice, teams["training"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env["TESSERA_CONFIG"] = str(logged_in.config)
    for command in ("ls", "nodes"):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before the first line
        try:
            done = subprocess.run(
                [sys.executable, "-m", "cli", command],
                stdout=write_end,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env=env,
                timeout=60,
            )
        finally:
            os.close(write_end)
        assert done.returncode == 141, done.stderr
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_show_wraps_long_event_messages_whole(logged_in, alice, teams, submit_as):
    from scheduling.jobs.models import JobEvent

    job = submit_as(alice, teams["training"])
    words = " ".join(f"word{i}" for i in range(60))
    JobEvent.objects.create(job=job, from_state="pending", to_state="pending", code="note", message=words)
    shown = logged_in("show", str(job.pk))
    assert shown.returncode == 0 and "…" not in shown.stdout
    events = shown.stdout.split("Events:")[1]
    assert " ".join(events.split()).count(words) == 1  # every word, in order, across the wrapped lines


def test_logs_follow_of_a_pending_job_says_where_it_waits_then_ends(logged_in, alice, teams, submit_as):
    job = submit_as(alice, teams["training"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("TESSERA_")}
    env["TESSERA_CONFIG"] = str(logged_in.config)
    follower = subprocess.Popen(
        [sys.executable, "-m", "cli", "logs", str(job.pk), "-f", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    try:
        first = follower.stderr.readline()
        assert first.startswith("pending: position "), first
        job_cancel(job=job, actor=alice)  # while it follows
        out, err = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 0 and out == ""
    assert "cancelled: its output follows" in err


def test_logs_of_a_job_that_failed_at_once_prints_its_stderr(
    logged_in, alice, teams, submit_as, settings, tmp_path
):
    from scheduling.agents import joblogs
    from scheduling.choices import JobState
    from scheduling.jobs.models import Job

    settings.TESSERA_LOG_DIR = str(tmp_path / "logs")
    job = submit_as(alice, teams["training"], command="jupyter lab")
    joblogs.log_append(job_id=job.pk, stream="stderr", data="sh: 1: jupyter: not found\n")
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED, exit_code=127)
    result = logged_in("logs", str(job.pk))
    assert result.returncode == 0 and result.stdout == ""
    assert f"job {job.pk} failed, exit code 127; stdout is empty; stderr has:" in result.stderr
    assert "jupyter: not found" in result.stderr


def test_a_member_of_two_teams_is_told_how_to_name_one_and_whoami_shows_quotas(logged_in, alice, teams):
    from quotas.services import membership_set

    membership_set(user=alice, team=teams["inference"])
    result = logged_in("submit", "-G", "1", "--", "python", "train.py")
    assert result.returncode == ExitCode.INVALID
    assert "pass -A <team> (your teams: ai-lab/inference, ai-lab/training)" in result.stderr, result.stderr
    me = logged_in("whoami").stdout
    assert "ai-lab/training" in me and "ai-lab/inference" in me
    assert "GPUs guaranteed, limit" in me and "held now: 0 GPUs" in me
    assert "priority classes: " in me and "default training" in me


def test_show_and_ls_say_a_running_jobs_node_is_not_responding(
    logged_in, alice, teams, submit_as, node, a100
):
    from datetime import timedelta

    from django.utils import timezone

    from scheduling.cycle import apply, lease
    from scheduling.engine import types as eng
    from scheduling.inventory.models import Node

    job = submit_as(alice, teams["training"])
    placement = eng.Placement(str(job.pk), (eng.Assignment(node.name, 0, 81920, 1000),))
    apply.apply_decisions(decisions=eng.Decisions(placements=(placement,)), epoch=lease.epoch_issue())
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=timezone.now() - timedelta(minutes=5))
    shown = logged_in("show", str(job.pk)).stdout
    assert f"Node {node.name} has not responded since" in " ".join(shown.split())
    listed = logged_in("ls").stdout
    assert f"node {node.name} not responding since" in listed


def test_show_says_what_it_does_not_know_in_words_never_none_or_dashes(logged_in, alice, teams, submit_as):
    pending = submit_as(alice, teams["training"])
    shown = " ".join(logged_in("show", str(pending.pk)).stdout.split())
    assert "Estimated start not known yet (give the job a runtime limit, -t, for an estimate)" in shown
    assert "(-)" not in shown
    cancelled = submit_as(alice, teams["training"])
    job_cancel(job=cancelled, actor=alice)
    shown = " ".join(logged_in("show", str(cancelled.pk)).stdout.split())
    assert "(cancelled)" in shown and "None" not in shown


def test_the_queue_says_why_another_teams_job_waits_in_general_words(logged_in, bob, teams):
    from scheduling.jobs.models import Job

    theirs = job_submit(
        submitter=bob, team=teams["inference"], spec=JobSpec(name="bobs", command="x", gpus=1)
    )
    Job.objects.filter(pk=theirs.pk).update(
        pending_reason_code="insufficient-gpus", pending_reason="needs 8 on a100-01 (bob's own words)"
    )
    shown = logged_in("queue")
    assert shown.returncode == 0, shown.stderr
    assert "no node has enough free" in shown.stdout  # was the bare code, "insufficient-gpus"
    assert "insufficient-gpus" not in shown.stdout and "bob's own words" not in shown.stdout


def test_an_array_is_submitted_listed_as_one_line_expanded_and_cancelled_in_part(logged_in):
    from scheduling.cycle import runner

    submitted = logged_in("submit", "-G", "1", "--array", "0-9%4", "--json", "--", "python", "sweep.py")
    assert submitted.returncode == 0, submitted.stderr
    array_id = json.loads(submitted.stdout)["id"]
    runner.cycle_run_once()  # %4: tasks 0-3 placed

    listing = logged_in("ls").stdout.splitlines()
    assert len(listing) == 2, listing  # one line for the array
    assert listing[1].startswith(f"{array_id}_[0-9%4]") and "6 pending, 4 placed" in listing[1]
    tasks = logged_in("ls", "--array", str(array_id)).stdout
    assert f"{array_id}_0 " in tasks and f"{array_id}_3 " in tasks
    shown = logged_in("show", str(array_id)).stdout
    assert "10 tasks (0-9%4), at most 4 at once: 6 pending, 4 placed" in shown

    cancelled = logged_in("cancel", str(array_id), "--tasks", "2-5")
    assert cancelled.returncode == 0, cancelled.stderr
    assert (
        cancelled.stdout.strip()
        == f"Cancelled tasks 2-5 of array {array_id}: 4 cancelled, 4 pending, 2 placed."
    )
    wrong = logged_in("cancel", str(array_id), "--tasks", "5-2")
    assert wrong.returncode == ExitCode.INVALID and "runs backwards" in wrong.stderr


def test_sbatch_dependency_flags_make_a_job_wait_for_another(logged_in):
    from scheduling.cycle import runner

    first = json.loads(logged_in("submit", "-G", "1", "--json", "--", "python", "a.py").stdout)
    then = logged_in("submit", "-G", "1", "-d", f"afterok:{first['id']}", "--json", "--", "python", "b.py")
    assert then.returncode == 0, then.stderr
    runner.cycle_run_once()
    shown = logged_in("show", str(json.loads(then.stdout)["id"])).stdout
    assert f"[dependency] Waits for job {first['id']} to succeed (it is placed)." in shown
    wrong = logged_in("submit", "-G", "1", "-d", "afterok:x", "--", "python", "c.py")
    assert wrong.returncode == ExitCode.INVALID and "depends_on" in wrong.stderr


def test_a_notebook_from_the_template_and_where_to_open_it(logged_in, alice, teams):
    """`tessera submit --template jupyter` submits the Jupyter session; `tessera open` prints its URL and says
    it opens once the job runs; `tessera ls` says when an idle job's GPUs are given back."""
    from scheduling.jobs.models import Job

    submitted = logged_in("submit", "--template", "jupyter", "--gpu-memory", "10GiB", "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert (job["name"], job["kind"], [p["name"] for p in job["ports"]]) == (
        "notebook",
        "interactive",
        ["jupyter"],
    )
    opened = logged_in("open", str(job["id"]))
    assert opened.returncode == 0, opened.stderr
    assert opened.stdout.strip().endswith(f"/jobs/{job['id']}/open/jupyter/")
    assert "the link answers once it runs" in opened.stderr
    assert logged_in("open", str(job["id"]), "tensorboard").returncode == 5
    Job.objects.filter(pk=job["id"]).update(state="running")
    Job.objects.filter(pk=job["id"]).update(idle_reclaim_at="2026-12-07T14:32:00Z")
    row = logged_in("ls").stdout.splitlines()[1]
    assert "idle: GPUs given back at 14:32 UTC unless used" in row


def test_submit_image_and_mounts_and_show_names_them(logged_in, alice, admin_user, teams):
    from quotas.models import TeamMount
    from quotas.services import team_mount_save
    from scheduling.jobs.models import Job

    team_mount_save(
        mount=TeamMount(
            team=teams["training"], name="datasets", host_path="/srv/d", container_path="/datasets"
        ),
        actor=admin_user,
    )
    image = "nvcr.io/nvidia/pytorch:24.05-py3"
    sent = logged_in("submit", "-G", "1", "--image", image, "--mount", "datasets", "--", "python", "train.py")
    assert sent.returncode == 0, sent.stderr
    job = Job.objects.get()
    assert (job.image, job.mounts) == (image, ["datasets"])
    shown = logged_in("show", str(job.pk))
    assert f"\nImage {image} with datasets\n" in "\n".join(
        " ".join(line.split()) for line in shown.stdout.splitlines()
    )
    refused = logged_in("submit", "-G", "1", "--mount", "scratch", "--", "true")
    assert refused.returncode != 0 and "mounts are for a job in an image" in refused.stderr
