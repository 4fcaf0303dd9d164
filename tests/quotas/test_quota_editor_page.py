"""The quota editor's page: tabs only for the GPU models the cluster has (and those a row names), and a warning
beside the field, before saving, when a memory size cannot hold its GPU count's cards (or the reverse)."""

from __future__ import annotations

import html
import re
from decimal import Decimal

import pytest

from quotas.models import Quota
from quotas.services import quota_save
from scheduling.inventory.models import GpuModel
from tests.quotas.editor import quota_form, signed_in

pytestmark = pytest.mark.django_db

URL = "/teams/ai-lab/training/quota/"


def _text(page: bytes, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', page.decode(), re.S)
    return html.unescape(found.group(1)).strip() if found else ""


def test_tabs_offer_the_installed_gpu_models_and_those_a_row_names_only(admin_user, teams, node):
    h200 = GpuModel.objects.create(name="H200-141GB", memory_mib=143_771, compute_capability=Decimal("9.0"))
    GpuModel.objects.create(name="T4", memory_mib=15_360, compute_capability=Decimal("7.5"))
    tabs = (
        signed_in(admin_user).get(URL).content.decode().split('aria-label="Quota rows"')[1].split("</nav>")[0]
    )
    assert "+ A100-80GB" in tabs
    assert "H200" not in tabs and "T4" not in tabs, "no card of them is installed"

    quota_save(quota=Quota(team=teams["training"], gpu_model=h200), actor=None)
    tabs = (
        signed_in(admin_user).get(URL).content.decode().split('aria-label="Quota rows"')[1].split("</nav>")[0]
    )
    assert "H200-141GB" in tabs and "+ H200" not in tabs, "the row the team has keeps its tab"


def test_a_memory_limit_that_cannot_hold_the_gpu_limits_cards_is_warned_beside_it_before_saving(
    admin_user, teams, node
):
    client = signed_in(admin_user)
    preview = client.post(
        f"{URL}preview/",
        quota_form(guaranteed_gpus="2", guaranteed_gib="160", limit_gpus="6", limit_gib="160"),
    ).content
    warning = _text(preview, "warning-limit_gib")
    assert (
        "160 GiB cannot hold the limit's 6 GPUs as whole cards: 6 A100-80GB need 480 GiB, it holds 2"
        in warning
    )
    assert 'hx-swap-oob="true"' in preview.decode(), "swapped in beside the field"
    assert "GPU memory limit (GiB): 160 GiB cannot hold" in html.unescape(preview.decode()), (
        "and in the preview"
    )
    assert _text(preview, "warning-guaranteed_gib") == "", "2 A100s are the 160 GiB guaranteed"
    assert Quota.objects.get(team=teams["training"], gpu_model__isnull=True).limit_gpus == 8, "nothing saved"


def test_a_memory_guarantee_beyond_what_its_gpus_hold_is_warned_beside_the_gpus(admin_user, teams, node):
    page = (
        signed_in(admin_user)
        .post(f"{URL}preview/", quota_form(guaranteed_gpus="2", guaranteed_gib="320"))
        .content
    )
    assert "2 GPUs cannot use the guarantee's 320 GiB of memory: 2 A100-80GB" in _text(
        page, "warning-guaranteed_gpus"
    )


def test_the_stored_quota_is_warned_on_opening_the_editor_and_a_saved_change_still_saves(
    admin_user, teams, node
):
    client = signed_in(admin_user)
    assert _text(client.get(URL).content, "warning-limit_gib") == "", "8 A100s are the 640 GiB of the limit"
    saved = client.post(
        URL,
        quota_form(
            guaranteed_gpus="2",
            guaranteed_gib="160",
            limit_gpus="6",
            limit_gib="160",
            reason="a smaller team",
        ),
    )
    assert saved.status_code == 302, "a warning, not a refusal"
    assert "cannot hold the limit's 6 GPUs" in _text(client.get(URL).content, "warning-limit_gib")
