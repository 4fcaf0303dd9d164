"""Quotas and fairness in the browser: an admin previews a quota change and saves it with a reason, and the audit
row appears; a team admin gets 403 on another team's quota and nothing is saved; /fairness/ shows the tree with
who borrows from whom."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tests.pipeline.harness import submit, wait_state

pytestmark = pytest.mark.slow


def _people():
    """An organisation with one team (its own quota), a staff member and that team's admin (idempotent: the
    package's cluster outlives each test)."""
    from django.contrib.auth import get_user_model

    from quotas.choices import Role
    from quotas.models import Quota, Team
    from quotas.services import membership_set, quota_save, team_create

    org = Team.objects.filter(slug="vision").first() or team_create(slug="vision", display_name="Vision")
    detect = Team.objects.filter(slug="vision/detect").first() or team_create(
        slug="vision/detect", display_name="Detection", parent=org
    )
    quota = Quota.objects.filter(team=detect, gpu_model__isnull=True).first() or Quota(team=detect)
    quota.guaranteed_gpus, quota.limit_gpus = Decimal("0.5"), Decimal(2)
    quota.guaranteed_gpu_memory_mib, quota.limit_gpu_memory_mib = 16 * 1024, 64 * 1024
    quota_save(quota=quota, actor=None, note="browser test setup")
    users = get_user_model().objects
    ops = users.filter(username="ops").first() or users.create_user(
        username="ops", password="ops-pw", is_staff=True
    )
    tara = users.filter(username="tara").first() or users.create_user(username="tara", password="tara-pw")
    membership_set(user=tara, team=detect, role=Role.TEAM_ADMIN)
    return {"org": org, "detect": detect, "ops": ops, "tara": tara}


def test_an_admin_previews_a_quota_change_saves_it_with_a_reason_and_the_audit_row_appears(browse):
    from quotas.models import Quota, QuotaChange

    people = _people()
    page = browse("ops")
    page.goto("/teams/vision/detect/quota/")
    assert page.input_value("#id_guaranteed_gib") == "16", "memory is edited in GiB"
    page.fill("#id_guaranteed_gpus", "1")
    page.fill("#id_guaranteed_gib", "32")
    page.click("#preview-button")
    page.wait_for_selector("#impact table.capacity")
    impact = page.inner_text("#impact")
    assert "all GPU models" in impact and "6 GPUs" in impact, "the two nodes' 6 cards"
    assert "over-committed" in impact, "pipe-lab alone is guaranteed 100 GPUs on this 6-GPU cluster"
    assert Quota.objects.get(team=people["detect"], gpu_model__isnull=True).guaranteed_gpus == Decimal("0.5")
    browse.shots(page, "preview")
    page.click("button[type=submit]")
    page.wait_for_selector("#error-reason")
    assert "reason is required" in page.inner_text("#error-reason")
    page.fill("#id_reason", "detection moves to the new model")
    page.click("button[type=submit]")
    page.wait_for_selector(".messages li")
    change = QuotaChange.objects.filter(team=people["detect"], actor=people["ops"]).first()
    assert change is not None and change.note == "detection moves to the new model"
    row = page.inner_text(f"#change-{change.pk}")
    assert "ops" in row and "0.5 GPUs → 1 GPU" in row and "16 GiB → 32 GiB" in row
    assert "detection moves to the new model" in row
    browse.shots(page, "saved-with-audit-row")
    # In a half-screen window the fields stay inside their boxes and the teams' buttons on one line.
    page.set_viewport_size({"width": 900, "height": 800})
    page.goto("/teams/vision/detect/quota/")
    past = page.evaluate(
        """() => [...document.querySelectorAll('#quota-form fieldset')].flatMap(box => [
            ...box.querySelectorAll('input, select')].filter(field =>
            field.getBoundingClientRect().right > box.getBoundingClientRect().right).map(field => field.name))"""
    )
    assert past == [], f"fields past their box at 900 px: {past}"
    page.goto("/teams/")
    edit = page.locator("a.button:text('Edit quota')").first.bounding_box()
    assert edit["height"] < 30, "'Edit quota' on one line"
    browse.shots(page, "teams-900")


def test_a_team_admin_cannot_edit_another_teams_quota(browse):
    from quotas.models import Quota, QuotaChange

    _people()
    page = browse("tara")
    response = page.goto("/teams/pipe-lab/quota/")
    assert response.status == 403
    assert "not a team admin of pipe-lab" in page.inner_text(
        "main"
    ) or "team admins of pipe-lab" in page.inner_text("main")
    browse.shots(page, "403")
    lab = Quota.objects.get(team__slug="pipe-lab", gpu_model__isnull=True)
    # Even a hand-made POST (with the page's CSRF cookie) is refused by the same rule.
    page.goto("/teams/vision/detect/quota/")
    token = page.eval_on_selector("input[name=csrfmiddlewaretoken]", "e => e.value")
    answer = page.request.post(
        "/teams/pipe-lab/quota/",
        form={
            "csrfmiddlewaretoken": token,
            "scope": "all",
            "guaranteed_gpus": "0",
            "guaranteed_gib": "0",
            "fair_share_weight": "1",
            "reason": "mine now",
        },
        headers={"Referer": browse.cluster.url + "/teams/vision/detect/quota/"},
    )
    assert answer.status == 403
    assert Quota.objects.get(pk=lab.pk).guaranteed_gpus == lab.guaranteed_gpus
    assert not QuotaChange.objects.filter(team__slug="pipe-lab", actor__username="tara").exists()


def test_fairness_shows_the_tree_and_who_borrows_from_whom(browse):
    from quotas.services import membership_set

    people = _people()
    membership_set(user=people["tara"], team=people["detect"], role="team_admin")
    running = submit(browse.cluster, name="held", command="sleep 120", gpus=2, nodes=2)
    wait_state(running, "running")
    from scheduling.jobs.fields import JobSpec
    from scheduling.jobs.submit import job_submit

    borrower = job_submit(
        submitter=people["tara"],
        team=people["detect"],
        spec=JobSpec(name="detect-run", command="sleep 120", gpus=1, gpu_models=("L4",)),
    )
    wait_state(borrower, "running")
    page = browse("alice")
    page.goto("/fairness/")
    tree = page.inner_text("#fairness-tree")
    assert "vision" in tree and "(organisation)" in tree and "vision/detect" in tree and "pipe-lab" in tree
    assert "detect-run" not in tree and "tara" not in tree, "aggregates only"
    loans = page.inner_text("table.loans")
    assert "vision/detect" in loans and "pipe-lab's unused guarantee" in loans
    browse.shots(page, "fairness")
