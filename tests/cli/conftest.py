"""CLI fixtures: jobs created through the services as setup."""

import pytest

from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit


@pytest.fixture(autouse=True)
def _fresh_login_throttle():
    """Each test logs in afresh; the sign-in throttle (20 a minute per address, counted in the live server's
    cache, this process's) is for attackers, not for a file of tests run back to back."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def submit_as():

    def _submit(user, team, **spec):
        spec = {"name": "job", "command": "python train.py", "gpus": 1, **spec}
        return job_submit(submitter=user, team=team, spec=JobSpec(**spec))

    return _submit
