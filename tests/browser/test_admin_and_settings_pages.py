"""Pages an admin and a researcher meet beside their jobs: the notification settings' checkbox on its label's
line, the admin site's quota in GiB and GPUs with a link to the portal's editor, and the quota editor's tabs and
its warning when the memory limit cannot hold the GPU limit's cards."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_by_email_checkbox_sits_on_its_labels_line_right_before_it(browse):
    page = browse("alice")
    page.goto("/account/notifications/")
    box = page.locator("#id_email").bounding_box()
    label = page.locator("label[for=id_email]").bounding_box()
    box_middle, label_middle = box["y"] + box["height"] / 2, label["y"] + label["height"] / 2
    assert abs(box_middle - label_middle) <= 2, f"checkbox middle {box_middle}, its label's {label_middle}"
    assert 0 <= label["x"] - (box["x"] + box["width"]) <= 16, (
        "the box right before its label, not centred apart"
    )
    # With no email address the box says why it is off, under it: beside it, the hint squeezed 'By' over 'email'.
    hint = page.locator(".field.check .help").bounding_box()
    assert label["height"] < 24 and hint["y"] >= label["y"] + label["height"], (label, hint)
    browse.shots(page, "notifications")


def _root():
    """A superuser, who sees every model on the admin site (idempotent: the package's cluster outlives a test)."""
    from django.contrib.auth import get_user_model

    users = get_user_model().objects
    return users.filter(username="root").first() or users.create_superuser(
        username="root", password="root-pw"
    )


def test_the_admin_shows_a_quota_in_gib_and_gpus_and_opens_the_portals_editor(browse):
    from quotas.models import Quota
    from tests.browser.test_quota_editor import _people

    detect = _people()["detect"]  # 0.5 GPUs and 16 GiB guaranteed; at most 2 GPUs and 64 GiB
    _root()
    quota = Quota.objects.get(team=detect, gpu_model__isnull=True)
    page = browse("root")
    page.goto("/admin/quotas/quota/")
    row = page.inner_text(f"tr:has(a[href='/admin/quotas/quota/{quota.pk}/change/'])")
    assert "0.5 GPUs · 16 GiB" in row and "2 GPUs · 64 GiB" in row, row
    link = page.locator(
        f"tr:has(a[href='/admin/quotas/quota/{quota.pk}/change/']) a:text('Edit with preview')"
    )
    box, table = link.bounding_box(), page.locator("#changelist-form .results").bounding_box()
    assert box["x"] + box["width"] <= table["x"] + table["width"], (
        "the editor's link in sight, not scrolled off"
    )
    browse.shots(page, "admin-quota-list")
    page.goto(f"/admin/quotas/quota/{quota.pk}/change/")
    assert page.input_value("#id_guaranteed_gpu_memory_mib") == "16"
    assert page.input_value("#id_limit_gpus") == "2"
    assert page.inner_text("label[for=id_limit_gpu_memory_mib]").startswith("GPU memory limit (GiB)")
    browse.shots(page, "admin-quota-change")
    page.click("text=Edit with impact preview")
    page.wait_for_url("**/teams/vision/detect/quota/?scope=all")
    assert page.input_value("#id_guaranteed_gib") == "16"


def test_the_quota_editor_warns_beside_the_field_when_memory_cannot_hold_the_gpu_limit(browse):
    from tests.browser.test_quota_editor import _people

    _people()
    page = browse("ops")
    page.goto("/teams/vision/detect/quota/")
    tabs = page.inner_text("nav.tabs")
    assert "A100-80GB" in tabs and "L4" in tabs, "the models installed"
    page.fill("#id_limit_gpus", "6")
    page.fill("#id_limit_gib", "64")
    page.click("#preview-button")
    page.wait_for_function(
        "() => /cannot hold the limit's 6 GPUs/.test(document.querySelector('#warning-limit_gib').textContent)",
        timeout=30_000,
    )
    warning = page.inner_text("#warning-limit_gib")
    assert "6 L4 need 135 GiB, it holds 2; 6 A100-80GB need 480 GiB, it holds 0" in warning, warning
    assert "cannot hold the limit's 6 GPUs" in page.inner_text("#impact"), "said in the preview too"
    browse.shots(page, "quota-warning")
