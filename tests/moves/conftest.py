"""A cluster where one node is the only place an 8-GPU NVLink job fits: an H100 node with NVSwitch and a node of two
PCIe L4 cards, each with its agent, daphne, a Celery worker and beat (tests/pipeline/harness.py), and Chromium
for the pages (skipped where it is missing)."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

import pytest
from django.db import connections

from tests.pipeline.harness import REPO, idle_again, running_cluster
from tests.support import CHROMIUM, launch_chromium, sign_in

ARTIFACTS = REPO / "test-artifacts"


def _teams(cluster) -> dict:
    """llm, guaranteed a whole H100 node, trains at a never-preempted class; vision is guaranteed one card."""
    from quotas.models import PriorityClass, Quota, TeamPriorityClass
    from quotas.services import membership_set, priority_class_grant_save, quota_save, team_create

    low = PriorityClass.objects.get(name="pipe-low")
    high = PriorityClass.objects.get(name="pipe-high")
    llm = team_create(slug="llm", display_name="LLM")
    priority_class_grant_save(grant=TeamPriorityClass(team=llm, priority_class=high), actor=None)
    quota_save(quota=Quota(team=llm, guaranteed_gpus=Decimal(8), default_priority_class=high), actor=None)
    vision = team_create(slug="vision", display_name="Vision")
    quota_save(quota=Quota(team=vision, guaranteed_gpus=Decimal(1), default_priority_class=low), actor=None)
    alice = cluster.people["alice"]
    membership_set(user=alice, team=llm)
    membership_set(user=alice, team=vision)
    return {"llm": llm, "vision": vision}


@pytest.fixture(scope="package")
def moves_cluster(django_db_setup, django_db_blocker, tmp_path_factory):
    with running_cluster(
        django_db_blocker,
        tmp_path_factory.mktemp("moves"),
        extra_seed=_teams,
        nodes={"move-h": "h100x8", "move-l": "l4x2"},
    ) as c:
        c.url = f"http://127.0.0.1:{c.port}"
        yield c


@pytest.fixture
def cluster(moves_cluster, django_db_blocker):
    with django_db_blocker.unblock():
        yield moves_cluster
        idle_again()


@pytest.fixture
def page(moves_cluster):
    """A signed-in page for alice at 1280x800, or None where Chromium or Playwright is missing."""
    if not Path(CHROMIUM).exists():
        yield None
        return
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        yield None
        return
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    with sync_playwright() as p:
        browser = launch_chromium(p)
        context = browser.new_context(viewport={"width": 1280, "height": 800}, base_url=moves_cluster.url)
        yield sign_in(context.new_page(), "alice")
        context.close()
        browser.close()
        connections.close_all()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"moves-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
