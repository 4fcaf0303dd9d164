"""Job output of any bytes travels job file -> agent -> daphne -> portal -> API and CLI intact, in frames the
websocket accepts, without dropping the agent's connection (which carries every other job's logs on the node)."""

from __future__ import annotations

import base64
import os
import random
import re
import subprocess
import sys

import requests

from quotas.tokens import api_token_create
from scheduling.agents import joblogs
from scheduling.choices import JobState
from scheduling.cycle.models import NodeSync
from tests.pipeline.harness import REPO, submit, wait_for, wait_state

PAYLOAD_BYTES = 300_000


def _connections() -> dict[str, tuple]:
    return {s.node.name: (s.connected_at, s.disconnected_at) for s in NodeSync.objects.select_related("node")}


def _agents_reconnecting(pipe) -> dict[str, int]:
    """How often each agent has logged losing its portal connection (or failing to make one)."""
    return {
        name: len(
            re.findall(r"portal connection (closed|failed)", pipe.procs[f"agent-{name}"].log.read_text())
        )
        for name in pipe.nodes
    }


def _api_bytes(pipe, token: str, job_id: int, stream: str) -> bytes:
    """The whole log through the REST API's base64 pages."""
    out, offset, size = b"", 0, None
    while size is None or offset < size:
        body = requests.get(
            f"http://127.0.0.1:{pipe.port}/api/v1/jobs/{job_id}/logs/",
            params={"stream": stream, "offset": offset, "encoding": "base64"},
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ).json()
        assert body["encoding"] == "base64" and "text" not in body, body
        chunk = base64.b64decode(body["data"], validate=True)
        assert body["next_offset"] == body["offset"] + len(chunk)
        out += chunk
        offset, size = body["next_offset"], body["size"]
    return out


def test_300_kb_of_nul_bytes_and_of_random_binary_arrive_intact_and_the_agent_stays_connected(pipe):
    nul = b"\0" * PAYLOAD_BYTES
    noise = random.Random(6).randbytes(PAYLOAD_BYTES)
    (pipe.root / "nul.bin").write_bytes(nul)
    (pipe.root / "noise.bin").write_bytes(noise)
    before, reconnecting_before = _connections(), _agents_reconnecting(pipe)
    job = submit(
        pipe,
        gpus=1,
        name="binary-logs",
        command=f"cat {pipe.root / 'nul.bin'}; cat {pipe.root / 'noise.bin'} >&2",
    )
    wait_state(job, JobState.SUCCEEDED, JobState.FAILED, timeout_s=30)
    assert job.state == JobState.SUCCEEDED, job.exit_code
    # The exit report carried the last line, cut short, its NULs shown as the database can keep them.
    (last_line,) = job.events.get(to_state=JobState.SUCCEEDED).data["log_tail"]["stdout"]
    assert 0 < len(last_line) <= 1000 and set(last_line) <= {"…", "\u2400"}
    wait_for(
        "both streams to reach the portal whole",
        lambda: [joblogs.log_size(job_id=job.pk, stream=s) for s in joblogs.STREAMS] == [PAYLOAD_BYTES] * 2,
        timeout_s=20,
    )
    assert joblogs.log_read(job_id=job.pk, stream="stdout")[0] == nul
    assert joblogs.log_read(job_id=job.pk, stream="stderr")[0] == noise
    # No agent's connection was dropped meanwhile: each node is still on the connection it had before the job.
    assert _connections() == before, (before, _connections())
    assert _agents_reconnecting(pipe) == reconnecting_before

    _, token = api_token_create(user=pipe.people["alice"], name="binary-logs")
    assert _api_bytes(pipe, token, job.pk, "stdout") == nul
    assert _api_bytes(pipe, token, job.pk, "stderr") == noise
    config = pipe.root / "cli.json"
    config.write_text(f'{{"url": "http://127.0.0.1:{pipe.port}", "token": "{token}"}}')
    config.chmod(0o600)
    cli = subprocess.run(
        [sys.executable, "-m", "cli", "logs", "--stderr", str(job.pk)],
        capture_output=True,
        cwd=REPO,
        env={**os.environ, "TESSERA_CONFIG": str(config)},
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout == noise
