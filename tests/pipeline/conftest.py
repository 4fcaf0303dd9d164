"""The end-to-end cluster fixture: two simulated nodes with agents, daphne, a Celery worker and beat.

The processes share the test database, so the data lives outside test transactions: the fixture writes it with
the database unblocked and flushes everything at the end, as pytest-django's transactional tests do.
"""

from __future__ import annotations

import pytest

from tests.pipeline.harness import idle_again, running_cluster


@pytest.fixture(scope="package")
def cluster(django_db_setup, django_db_blocker, tmp_path_factory):
    with running_cluster(django_db_blocker, tmp_path_factory.mktemp("pipeline")) as c:
        yield c


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.pipeline_failed = report.failed
    return report


@pytest.fixture
def pipe(cluster, django_db_blocker, request):
    """The cluster for one test; jobs it leaves alive are cancelled so the next test starts on idle GPUs."""

    with django_db_blocker.unblock():
        yield cluster
        if getattr(request.node, "pipeline_failed", False):
            print(cluster.logs())
        # A Celery process a test's Redis outage made exit is started again, as production's supervisor would.
        cluster.restart_exited_celery()
        idle_again()
