"""Shared fixtures: named people (alice trains, bob serves inference, carol is a team admin, admin is staff)
and a small cluster built through the services, as the portal would build it.

The suite runs on PostgreSQL; tests marked `both_databases` run a second time on SQLite, embedded (`make test`:
no Redis, tasks in process), so the plain paths behind portal/database.py are held to the same behaviour. One
among them that holds what only PostgreSQL has (row locks, set-based statement counts) is also marked
`postgresql_only(reason)` and skipped there, saying why."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

REPO = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO.parent / "shared"

# Property tests run the same examples every time, `make test` and CI alike (a red run is the code's, never the
# draw's): derandomized, with no deadline and no health check on speed (a loaded machine is slow, not wrong), and
# a failure prints the blob that replays it (@reproduce_failure); derandomized, Hypothesis keeps no database.
# HYPOTHESIS_PROFILE=explore draws new examples and keeps the failures it finds in .hypothesis/ (git-ignored), which
# the next explore runs replay first.
EXAMPLES = DirectoryBasedExampleDatabase(REPO / ".hypothesis" / "examples")
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", derandomize=False, database=EXAMPLES, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """On SQLite the test database is a file beside DATABASE_URL's (test_<name>), not Django's shared in-memory
    one: threads racing for a write there fail at once ("database table is locked") instead of waiting their
    turn, as the embedded portal's do on its file."""
    from django.conf import settings as django_settings

    from portal import database

    if not database.postgresql():
        test = django_settings.DATABASES["default"].setdefault("TEST", {})
        if not test.get("NAME"):
            name = Path(django_settings.DATABASES["default"]["NAME"])
            test["NAME"] = str(name.with_name(f"test_{name.name}"))


@pytest.fixture(scope="session", autouse=True)
def _redis_of_this_run():
    """The test Redis database starts empty: the test database's job ids start again at 1 every run, and what an
    earlier run left under a job's key there (its usage, its peak memory) is nothing of this run's jobs."""
    from scheduling.coordination import redis_client

    r = redis_client()
    if r is not None:
        r.flushdb()


@pytest.fixture(scope="session", autouse=True)
def _job_logs_of_this_run(tmp_path_factory):
    """Job logs the portal keeps go to a directory of this run's (the servers a test starts inherit it): the test
    database's job ids start again at 1 every run, and a log left under var/logs by an earlier run is no log of
    theirs."""
    from django.conf import settings as django_settings

    logs = str(tmp_path_factory.mktemp("portal-logs"))
    before = os.environ.get("TESSERA_LOG_DIR")
    django_settings.TESSERA_LOG_DIR = os.environ["TESSERA_LOG_DIR"] = logs
    yield
    if before is None:
        os.environ.pop("TESSERA_LOG_DIR", None)
    else:
        os.environ["TESSERA_LOG_DIR"] = before


# The packages whose people sign in through servers in processes of their own (daphne, the Celery worker), which
# check passwords with the production hasher.
PASSWORDS_CHECKED_ELSEWHERE = {"browser", "pipeline", "moves"}


@pytest.fixture(autouse=True)
def _fast_password_hashes(request):
    """New passwords are hashed with MD5 where they are checked in this process: the production hasher's
    deliberate slowness cost every person a test makes, and every sign-in, most of a second."""
    if Path(request.node.path).relative_to(REPO / "tests").parts[0] in PASSWORDS_CHECKED_ELSEWHERE:
        return
    from tests.support import FAST_PASSWORD_HASHERS

    request.getfixturevalue("settings").PASSWORD_HASHERS = FAST_PASSWORD_HASHERS


@pytest.fixture(autouse=True)
def _postgresql_only(request):
    marker = request.node.get_closest_marker("postgresql_only")
    if marker is not None:
        from portal import database

        if not database.postgresql():
            pytest.skip(f"PostgreSQL only: {marker.args[0] if marker.args else 'its fast path'}")


@pytest.fixture
def priority_classes(db):
    from quotas.services import priority_classes_ensure_defaults

    return {pc.name: pc for pc in priority_classes_ensure_defaults()}


@pytest.fixture
def teams(db, priority_classes):
    from quotas.models import Quota
    from quotas.services import quota_save, team_create

    org = team_create(slug="ai-lab", display_name="AI Lab")
    training = team_create(slug="ai-lab/training", display_name="Training", parent=org)
    inference = team_create(slug="ai-lab/inference", display_name="Inference", parent=org)
    quota_save(
        quota=Quota(
            team=training,
            guaranteed_gpu_memory_mib=320 * 1024,
            limit_gpu_memory_mib=640 * 1024,
            guaranteed_gpus=Decimal(4),
            limit_gpus=Decimal(8),
            default_priority_class=priority_classes["training"],
        ),
        actor=None,
    )
    quota_save(
        quota=Quota(
            team=inference,
            guaranteed_gpu_memory_mib=64 * 1024,
            limit_gpu_memory_mib=128 * 1024,
            guaranteed_gpus=Decimal(1),
            limit_gpus=Decimal(2),
            default_priority_class=priority_classes["inference"],
        ),
        actor=None,
    )
    return {"training": training, "inference": inference, "org": org}


@pytest.fixture
def grant(db, priority_classes):
    """Grant a team a priority class (optionally with a per-class limit in GPUs), as an admin would."""
    from quotas.models import TeamPriorityClass
    from quotas.services import priority_class_grant_save

    def _grant(team, class_name: str, limit_gpus=None):
        row = TeamPriorityClass(team=team, priority_class=priority_classes[class_name], limit_gpus=limit_gpus)
        priority_class_grant_save(grant=row, actor=None)
        return row

    return _grant


def _user(django_user_model, username: str, **extra):
    return django_user_model.objects.create_user(username=username, password=f"{username}-pw", **extra)


@pytest.fixture
def admin_user(django_user_model):
    return _user(django_user_model, "admin", is_staff=True, is_superuser=True)


@pytest.fixture
def alice(django_user_model, teams):
    from quotas.services import membership_set

    user = _user(django_user_model, "alice")
    membership_set(user=user, team=teams["training"])
    return user


@pytest.fixture
def bob(django_user_model, teams):
    from quotas.services import membership_set

    user = _user(django_user_model, "bob")
    membership_set(user=user, team=teams["inference"])
    return user


@pytest.fixture
def carol(django_user_model, teams):
    from quotas.choices import Role
    from quotas.services import membership_set

    user = _user(django_user_model, "carol")
    membership_set(user=user, team=teams["training"], role=Role.TEAM_ADMIN)
    return user


@pytest.fixture
def a100(db):
    from scheduling.inventory.models import GpuModel

    return GpuModel.objects.create(
        name="A100-80GB",
        memory_mib=81920,
        compute_capability=Decimal("8.0"),
        sharing_modes=["exclusive", "mps"],
    )


@pytest.fixture
def node(db, a100):
    """One node with 8 A100s: GPUs 0-5 exclusive, 6-7 MPS, all NVLink-connected."""
    from scheduling.choices import LinkKind, SharingMode
    from scheduling.inventory.models import Gpu, GpuLink, Node

    node = Node.objects.create(name="a100-01", cpu_milli=128_000, memory_mib=1024 * 1024)
    gpus = [
        Gpu.objects.create(
            node=node,
            index=i,
            uuid=f"GPU-test-{i}",
            model=a100,
            memory_mib=81920,
            numa_node=i // 4,
            sharing_mode=SharingMode.MPS if i >= 6 else SharingMode.EXCLUSIVE,
        )
        for i in range(8)
    ]
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            GpuLink.objects.create(gpu_a=a, gpu_b=b, kind=LinkKind.NVLINK, nvlink_count=12)
    return node


@pytest.fixture
def fresh_watch():
    """No record of earlier watchdog runs (the Redis keys other tests left, or the process's own marks)."""
    from scheduling import coordination
    from scheduling.cycle import watchdog

    r = coordination.redis_client()
    if r is not None:
        r.delete(watchdog._LAST_RUN_KEY, watchdog._RESUMED_KEY)
    watchdog._local_marks.clear()
