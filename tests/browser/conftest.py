"""Browser tests: Debian's Chromium driven by Playwright against the real cluster of tests/pipeline (daphne with
websockets, a Celery worker and beat, simulated agents running real processes, PostgreSQL, Redis).

Each test saves screenshots under test-artifacts/ (git-ignored). Skipped, with the reason, where Chromium or
Playwright is missing; `.ci/run` installs both.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connections

from tests.pipeline.harness import REPO, idle_again, running_cluster, wait_for
from tests.support import CHROMIUM, launch_chromium, session_cookie, sign_in

ARTIFACTS = REPO / "test-artifacts"


def _more_people(cluster) -> dict:
    """Bob, in another team with its own quota, to look at alice's work from outside."""
    from django.contrib.auth import get_user_model

    from quotas.models import Quota
    from quotas.services import membership_set, quota_save, team_create

    other = team_create(slug="other-lab", display_name="Other lab")
    quota_save(
        quota=Quota(team=other, guaranteed_gpus=Decimal(1), guaranteed_gpu_memory_mib=81920), actor=None
    )
    bob = get_user_model().objects.create_user(username="bob", password="bob-pw")
    membership_set(user=bob, team=other)
    return {"bob": bob, "other": other}


@pytest.fixture(scope="package")
def portal(django_db_setup, django_db_blocker, tmp_path_factory):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"browser tests need Chromium at {CHROMIUM} (apt-get install chromium)")
    with running_cluster(django_db_blocker, tmp_path_factory.mktemp("portal"), extra_seed=_more_people) as c:
        c.url = f"http://127.0.0.1:{c.port}"
        yield c


@pytest.fixture(scope="package")
def chromium(portal):
    playwright = pytest.importorskip("playwright.sync_api", reason="browser tests need playwright (pip)")
    # Playwright's sync API keeps an event loop running in this thread; the test's own database calls are
    # plain synchronous ones all the same (Django's guard cannot tell, pytest-django's docs advise this).
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with playwright.sync_playwright() as p:
        browser = launch_chromium(p)
        yield browser
        browser.close()
        # Database connections opened while Playwright's loop ran belong to its context: close them here, or
        # the test database cannot be dropped at the end.
        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@pytest.fixture
def cluster_for_test(portal, django_db_blocker):
    """The package's cluster for one test, left as the next test expects it: no job alive, every node ready and
    its agent heard (a test that drops the web drops the agents too; the next one must not meet them away)."""
    with django_db_blocker.unblock():
        yield portal
        idle_again()
        wait_for("every node ready, its agent heard", portal.nodes_ready, timeout_s=20)


class Screens:
    def __init__(self, name: str):
        self.name = name
        self.n = 0
        ARTIFACTS.mkdir(exist_ok=True)

    def __call__(self, page, what: str) -> Path:
        self.n += 1
        path = ARTIFACTS / f"{self.name}-{self.n:02d}-{what}.png"
        page.screenshot(path=str(path), full_page=True)
        return path


@pytest.fixture
def browse(chromium, cluster_for_test, request):
    """browse(user) -> a page at 1280x800 signed in as `user` (through the sign-in form when a password is given),
    on /jobs/; shots(page, what) saves one."""
    contexts = []
    shots = Screens(request.node.name.removeprefix("test_")[:60])

    def open_as(username: str | None, password: str | None = None):
        context = chromium.new_context(viewport={"width": 1280, "height": 800}, base_url=cluster_for_test.url)
        contexts.append(context)
        page = context.new_page()
        page.errors = []
        page.on("pageerror", lambda e: page.errors.append(str(e)))
        if username and password is None:  # signed in as the form would, without its password check
            context.add_cookies([session_cookie(username, cluster_for_test.url)])
            page.goto("/jobs/")
        elif username:
            sign_in(page, username, password)
        return page

    open_as.shots = shots
    open_as.cluster = cluster_for_test
    yield open_as
    for context in contexts:
        context.close()
