"""The end-to-end cluster fixture: two simulated nodes with agents, daphne, a Celery worker and beat.

The processes share the test database, so the data lives outside test transactions: the fixture writes it with
the database unblocked and flushes everything at the end, as pytest-django's transactional tests do.
"""

from __future__ import annotations

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import OperationalError, connection, transaction

from tests.pipeline.harness import NODE_LOST_AFTER_S, Cluster, seed, wait_for


def _use_redis(url: str):
    """Point this process (cycle requests, Celery, the channel layer) at the cluster's private Redis.
    Returns the undo."""
    from django.test import override_settings

    from portal.celery import app

    host = {"address": url, "socket_timeout": settings.CHANNEL_REDIS_SOCKET_TIMEOUT_S}
    layer = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [host]}}}
    overrides = override_settings(REDIS_URL=url, CELERY_BROKER_URL=url, CHANNEL_LAYERS=layer)
    overrides.enable()
    old_broker = app.conf.broker_url

    def point(broker: str) -> None:
        if app._pool is not None:
            app._pool.force_close_all()
        app.conf.broker_url = broker
        app._pool = None  # as Celery does after a fork: the next publish connects afresh
        app.amqp._producer_pool = None

    point(url)

    def undo() -> None:
        point(old_broker)
        overrides.disable()

    return undo


@pytest.fixture(scope="package")
def cluster(django_db_setup, django_db_blocker, tmp_path_factory):
    if not settings.REDIS_URL or connection.vendor != "postgresql":
        pytest.skip(
            "the end-to-end pipeline needs PostgreSQL and Redis: set DATABASE_URL and REDIS_URL (make test)"
        )
    from scheduling.coordination import redis_client
    from scheduling.cycle.models import NodeSync
    from scheduling.cycle.requests import KEYS
    from scheduling.inventory.models import Gpu

    own_db = None
    if not connection.settings_dict["NAME"].startswith("test_"):
        # pytest-django sets up databases only for tests marked django_db, and these tests must not be: their
        # writes have to be committed for the other processes to see them. Alone in a session, set it up here.
        from django.test.utils import setup_databases

        with django_db_blocker.unblock():
            own_db = setup_databases(verbosity=0, interactive=False, aliases={"default"})
    root = tmp_path_factory.mktemp("pipeline")
    (root / "starts").mkdir()
    old_log_dir = getattr(settings, "TESSERA_LOG_DIR", None)
    settings.TESSERA_LOG_DIR = str(root / "portal-logs")
    settings.TESSERA_NODE_LOST_AFTER_S = NODE_LOST_AFTER_S
    with django_db_blocker.unblock():
        c = Cluster(root)
        c.redis = c.start_redis()
        redirected = _use_redis(c.redis_url) if c.redis else None
        redis_client().delete(*KEYS)
        c.people = seed(c)
        try:
            c.start_web()
            c.start_worker()
            c.start_beat()
            for node in c.nodes:
                c.start_agent(node)
            wait_for(
                "both agents to say hello and report their GPUs",
                lambda: (
                    NodeSync.objects.filter(connected_at__isnull=False).count() == 2
                    and not Gpu.objects.filter(uuid__startswith="unreported-").exists()
                ),
                timeout_s=60,
            )
            yield c
        except BaseException:
            print(c.logs())
            raise
        finally:
            c.stop_all()
            c.kill_job_processes()
            if redirected is not None:
                redirected()
            else:
                redis_client().delete(*KEYS)
            call_command("flush", interactive=False, verbosity=0)
            settings.TESSERA_LOG_DIR = old_log_dir
            if own_db is not None:
                from django.test.utils import teardown_databases

                teardown_databases(own_db, verbosity=0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.pipeline_failed = report.failed
    return report


def _cancel_live_jobs() -> None:
    """Cancel every live job in one commit, so no cycle hands the freed GPUs to a job about to be cancelled.

    It takes its locks in the cycle's order (nodes, then jobs by id, then GPUs): releasing two slices of one GPU
    in one transaction makes PostgreSQL check the GPU's node reference at commit (FOR KEY SHARE), which would
    wait on a cycle holding that node while the cycle waits on one of our jobs.
    """
    from scheduling import lock_objects
    from scheduling.jobs.models import Job
    from scheduling.jobs.services import job_cancel
    from scheduling.jobs.states import LIVE_STATES, IllegalTransition

    with transaction.atomic():
        list(lock_objects.nodes_for_update())
        live = list(Job.objects.select_for_update(of=("self",)).filter(state__in=LIVE_STATES).order_by("id"))
        for job in live:
            try:
                with transaction.atomic():
                    job_cancel(job=job, actor=None)
            except IllegalTransition:
                pass  # it finished meanwhile


@pytest.fixture
def pipe(cluster, django_db_blocker, request):
    """The cluster for one test; jobs it leaves alive are cancelled so the next test starts on idle GPUs."""
    from scheduling.inventory.models import Gpu

    with django_db_blocker.unblock():
        yield cluster
        if getattr(request.node, "pipeline_failed", False):
            print(cluster.logs())
        for attempt in range(3):
            try:
                _cancel_live_jobs()
                break
            except OperationalError as exc:  # a deadlock the database broke: the cleanup tries again
                print(f"cancelling the test's live jobs, attempt {attempt + 1}: {exc}")
        else:
            raise AssertionError("could not cancel the jobs this test left alive")
        wait_for(
            "the GPUs to be free again",
            lambda: not Gpu.objects.filter(allocated_memory_mib__gt=0).exists(),
            timeout_s=15,
        )
