"""A job in a container image, end to end: submitted to the portal, placed by the cycle, run by a real agent with
the host's Podman, its output read back through the portal, its image's readiness on its timeline, and a missing
image ending it image_pull_failed. Skips where this host has no rootful Podman."""

from __future__ import annotations

from scheduling.agents import joblogs
from scheduling.choices import JobState
from tests.pipeline.harness import submit, wait_for, wait_state
from tests.support import busybox_image


def test_a_job_in_an_image_runs_and_its_output_reaches_the_portal(pipe):
    image = busybox_image()
    job = submit(
        pipe, gpus=1, name="in-image", image=image, command="echo hello from $(uname -s) in an image; ls /"
    )
    missing = submit(
        pipe, gpus=1, name="no-image", image="localhost/tessera-no-such-image:404", command="true"
    )
    wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout_s=60)
    assert job.state == JobState.SUCCEEDED, (job.exit_code, [e.message for e in job.events.all()])
    wait_for(
        "its output to reach the portal",
        lambda: b"hello from Linux in an image" in joblogs.log_read(job_id=job.pk, stream="stdout")[0],
        timeout_s=20,
    )
    listing = joblogs.log_read(job_id=job.pk, stream="stdout")[0].decode().split()
    assert "bin" in listing and "usr" not in listing  # the image's tree, not the host's
    ready = wait_for(
        "the image's readiness on its timeline", lambda: job.events.filter(code="image_ready").first()
    )
    assert ready.message.startswith(f"Image {image} was already on ")

    wait_state(missing, JobState.FAILED, timeout_s=60)
    ended = missing.events.get(code="image_pull_failed")
    assert "cannot pull image localhost/tessera-no-such-image:404" in ended.message, ended.message
