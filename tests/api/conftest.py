"""API fixtures: clients signed in as the named people of tests/conftest.py, by token or by session."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from scheduling.jobs.fields import JobSpec
from scheduling.jobs.submit import job_submit


@pytest.fixture(autouse=True)
def _fresh_throttle_counters():
    from django.core.cache import cache

    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def anon():
    return APIClient()


def _token_client(user) -> APIClient:
    from quotas.tokens import api_token_create

    _, token = api_token_create(user=user, name="tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    client.user = user
    return client


@pytest.fixture
def as_alice(alice, node):
    return _token_client(alice)


@pytest.fixture
def as_bob(bob, node):
    return _token_client(bob)


@pytest.fixture
def as_carol(carol, node):
    return _token_client(carol)


@pytest.fixture
def as_admin(admin_user, node):
    return _token_client(admin_user)


@pytest.fixture
def dave(django_user_model, teams):
    """A second member of the training team, alice's teammate (not an admin)."""
    from quotas.services import membership_set

    user = django_user_model.objects.create_user(username="dave", password="dave-pw")
    membership_set(user=user, team=teams["training"])
    return user


@pytest.fixture
def as_dave(dave, node):
    return _token_client(dave)


@pytest.fixture
def submit():
    """Submit a job through the services as a given user (setup, not the thing under test)."""

    def _submit(user, team, **spec):
        spec.setdefault("name", "job")
        spec.setdefault("command", "python train.py")
        if not spec.get("gpus") and not spec.get("gpu_memory_mib") and not spec.get("compute_pct"):
            spec["gpus"] = 1
        return job_submit(submitter=user, team=team, spec=JobSpec(**spec))

    return _submit
