"""CLI fixtures: jobs created through the services as setup."""

import pytest

from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit


@pytest.fixture
def submit_as():

    def _submit(user, team, **spec):
        spec = {"name": "job", "command": "python train.py", "gpus": 1, **spec}
        return job_submit(submitter=user, team=team, spec=JobSpec(**spec))

    return _submit
