"""CLI fixtures: jobs created through the services as setup."""

import pytest

from scheduling.jobs import services


@pytest.fixture
def submit_as():

    def _submit(user, team, **spec):
        spec = {"name": "job", "command": "python train.py", "gpus": 1, **spec}
        return services.job_submit(submitter=user, team=team, spec=services.JobSpec(**spec))

    return _submit
