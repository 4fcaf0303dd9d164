"""docs/examples/, as a new user of `make demo` meets them: each file, read by the CLI as `tessera submit <file>`
reads it (`--dry-run` prints what it would send) and posted to the API as the demo user its comment (or
docs/api.md) names, against the demo's seed, is accepted, and the engine places it at once (a what-if: the same
cycle, placing nothing). The demo agents' PATH has every program the examples run."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from rest_framework.test import APIClient

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "docs/examples"
# Each example and the demo user who is in its team (docs/api.md says the same).
EXAMPLES = {
    "notebook-slice.yaml": "alice",
    "train-nvlink.yaml": "alice",
    "gang-2-nodes.yaml": "alice",
    "inference-eval.json": "bob",
    "train.sh": "alice",
}


def _as_the_cli_sends_it(path: Path, capsys) -> dict:
    from cli.submit import submit

    assert submit([str(path), "--dry-run"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def demo(db):
    from demo.seed import load_demo
    from scheduling.cycle import whatif

    load_demo()
    whatif._cached = None  # another test's snapshot is not this database's
    yield
    whatif._cached = None


def test_every_example_is_listed():
    assert {p.name for p in EXAMPLES_DIR.iterdir()} == set(EXAMPLES)


def test_each_example_is_accepted_and_starts_at_once_for_its_demo_user(demo, capsys):
    from django.contrib.auth import get_user_model

    from quotas.models import Team
    from quotas.selectors import team_slugs_for_user
    from scheduling.cycle.whatif import job_whatif
    from scheduling.jobs.spec import spec_from_mapping

    users = {u.username: u for u in get_user_model().objects.filter(username__in=set(EXAMPLES.values()))}
    sent = {name: _as_the_cli_sends_it(EXAMPLES_DIR / name, capsys) for name in EXAMPLES}
    # Each alone against the seed, as a new user tries one at a time (together they would exceed the team's limit).
    for name, spec in sent.items():
        user = users[EXAMPLES[name]]
        parsed = spec_from_mapping(spec)
        slug = parsed.team or team_slugs_for_user(user=user, limit=2)[0]
        answer = job_whatif(user=user, team=Team.objects.get(slug=slug), spec=parsed.spec)
        assert answer.verdict == "now", (name, answer.text)
    for name, spec in sent.items():
        client = APIClient()
        client.force_authenticate(users[EXAMPLES[name]])
        response = client.post("/api/v1/jobs/", spec, format="json")
        assert response.status_code == 201, (name, response.json())
        assert response.json()["state"] == "pending"


def test_the_demo_agents_have_every_program_the_examples_run(tmp_path, capsys):
    from demo.management.commands.run_demo import write_stand_ins

    write_stand_ins(tmp_path)
    on_path = {p.name for p in tmp_path.iterdir()}
    for name in EXAMPLES:
        command = _as_the_cli_sends_it(EXAMPLES_DIR / name, capsys)["command"]
        words = command if isinstance(command, list) else shlex.split(command)
        program = words[0]
        if program == "bash":  # a script: what it runs
            script = Path(words[1]).read_text().splitlines()
            program = next(line for line in script if line and not line.startswith("#")).split()[0]
        assert program in on_path, (name, program)
