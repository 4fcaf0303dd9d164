"""The quota editor's service: who may change what (staff any team; a team admin only lowers their own team's),
a required reason, the audit trail, undo and its conflicts; and the impact preview, asked of the engine on a
snapshot with the edited quota swapped in."""

from decimal import Decimal

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from quotas.errors import QuotaConflict, QuotaForbidden, QuotaRefused
from quotas.models import Quota, QuotaChange
from quotas.services import quota_change_undo, quota_save
from scheduling.cycle.quota_whatif import quota_impact
from tests.engine import builders as b

pytestmark = pytest.mark.django_db


def _quota(team) -> Quota:
    return Quota.objects.select_related("team").get(team=team, gpu_model__isnull=True)


def test_staff_edit_any_team_and_the_audit_row_keeps_the_reason(teams, admin_user):
    quota = _quota(teams["inference"])
    quota.guaranteed_gpus = Decimal(2)
    quota.limit_gpus = Decimal(3)
    change = quota_save(quota=quota, actor=admin_user, source="portal", note="new serving model")
    assert change.note == "new serving model" and change.source == "portal" and change.actor == admin_user
    assert change.changes == {
        "guaranteed_gpus": {"old": "1", "new": "2"},
        "limit_gpus": {"old": "2", "new": "3"},
    }


def test_a_change_without_a_reason_is_refused_naming_reason_and_nothing_is_saved(teams, admin_user):
    quota = _quota(teams["inference"])
    quota.guaranteed_gpus = Decimal(2)
    with pytest.raises(QuotaRefused) as caught:
        quota_save(quota=quota, actor=admin_user, note="  ")
    assert caught.value.field == "reason"
    assert _quota(teams["inference"]).guaranteed_gpus == 1 and not QuotaChange.objects.filter(
        actor=admin_user
    )


def test_a_reason_over_300_characters_is_refused_with_the_limit(teams, admin_user):
    quota = _quota(teams["inference"])
    quota.guaranteed_gpus = Decimal(2)
    with pytest.raises(QuotaRefused) as caught:
        quota_save(quota=quota, actor=admin_user, note="x" * 301)
    assert (caught.value.field, caught.value.limit) == ("reason", 300)
    assert "301 characters" in caught.value.message


def test_a_team_admin_of_another_team_is_refused_and_nothing_is_saved(teams, carol):
    quota = _quota(teams["inference"])  # carol administers training, not inference
    quota.guaranteed_gpus = Decimal(0)
    with pytest.raises(PermissionDenied) as caught:
        quota_save(quota=quota, actor=carol, note="trying")
    assert isinstance(caught.value, QuotaForbidden) and "not a team admin of ai-lab/inference" in str(
        caught.value
    )
    assert _quota(teams["inference"]).guaranteed_gpus == 1 and not QuotaChange.objects.filter(actor=carol)


def test_a_team_admin_may_lower_their_teams_guarantee_but_not_raise_it(teams, carol):
    quota = _quota(teams["training"])
    quota.guaranteed_gpus = Decimal(3)
    assert (
        quota_save(quota=quota, actor=carol, note="giving one back").changes["guaranteed_gpus"]["new"] == "3"
    )
    quota.guaranteed_gpus = Decimal(5)
    with pytest.raises(QuotaForbidden) as caught:
        quota_save(quota=quota, actor=carol, note="more please")
    assert caught.value.field == "guaranteed_gpus" and caught.value.limit == 3.0
    assert "not raise it (it is 3 GPUs)" in caught.value.message


def test_undo_restores_the_old_values_and_is_audited_as_an_undo(teams, admin_user, carol):
    quota = _quota(teams["training"])
    quota.guaranteed_gpus, quota.guaranteed_gpu_memory_mib = Decimal(2), 160 * 1024
    change = quota_save(quota=quota, actor=carol, note="we need less this month")
    undo = quota_change_undo(change=change, actor=carol, reason="we were wrong")
    restored = _quota(teams["training"])
    assert (restored.guaranteed_gpus, restored.guaranteed_gpu_memory_mib) == (4, 320 * 1024), (
        "a team admin may undo their own cut: it restores what staff had granted"
    )
    assert undo.note == f"undo of change #{change.pk}: we were wrong" and undo.undo_of == change
    assert undo.changes["guaranteed_gpus"] == {"old": "2", "new": "4"}


def test_undo_is_refused_when_the_quota_changed_since(teams, admin_user):
    quota = _quota(teams["training"])
    quota.limit_gpus = Decimal(10)
    first = quota_save(quota=quota, actor=admin_user, note="bigger runs")
    quota.limit_gpus = Decimal(12)
    quota_save(quota=quota, actor=admin_user, note="even bigger")
    with pytest.raises(QuotaConflict) as caught:
        quota_change_undo(change=first, actor=admin_user, reason="undo the first")
    assert caught.value.field == "limit_gpus" and "undo the later change first" in caught.value.message
    assert _quota(teams["training"]).limit_gpus == 12


def test_an_undo_that_would_put_a_limit_below_its_guarantee_is_refused_naming_the_field(teams, admin_user):
    quota = _quota(teams["training"])
    quota.limit_gpus = Decimal(10)
    raised_limit = quota_save(quota=quota, actor=admin_user, note="bigger runs")
    quota.guaranteed_gpus = Decimal(9)
    quota_save(quota=quota, actor=admin_user, note="a big grant")
    with pytest.raises(ValidationError) as caught:  # the limit back at 8, under a guarantee of 9
        quota_change_undo(change=raised_limit, actor=admin_user, reason="back")
    assert "limit_gpus" in caught.value.message_dict
    assert _quota(teams["training"]).limit_gpus == 10


# -- the impact preview -------------------------------------------------------------------------------------


def _cluster(a100_team_guarantee_gpus: int):
    """One 8-card node. ai-lab/training runs two 2-card jobs; ai-lab/inference has one 4-card job waiting."""
    nodes = [b.node("n1", gpus=8, model="A100-80GB")]
    first = b.running(b.job("1", team="ai-lab/training", gpus=2), {"n1": [0, 1]}, nodes=nodes, start=100)
    second = b.running(b.job("2", team="ai-lab/training", gpus=2), {"n1": [2, 3]}, nodes=nodes, start=200)
    waiting = b.job("3", team="ai-lab/inference", gpus=4, submit=300)
    return b.snapshot(
        nodes,
        running_jobs=[first, second],
        pending=[waiting],
        quotas=[
            b.quota("ai-lab/training", guaranteed_gpus=4, limit_gpus=8),
            b.quota("ai-lab/inference", guaranteed_gpus=a100_team_guarantee_gpus, limit_gpus=8),
        ],
    )


def test_a_cut_guarantee_shows_the_team_running_job_that_becomes_borrowed(teams):
    row = _quota(teams["training"])
    row.guaranteed_gpus = Decimal(2)
    impact = quota_impact(row=row, snapshot=_cluster(1))
    assert [j.job_id for j in impact.becomes_borrowed] == [2], (
        "the younger job is the last in guarantee order"
    )
    assert (impact.before.borrowed_gpus, impact.after.borrowed_gpus) == (0, 2)
    assert impact.capacity[0].guaranteed_gpus_before == 5 and impact.capacity[0].guaranteed_gpus_after == 3


def test_a_raised_guarantee_lets_a_pending_job_start(teams):
    snapshot = _cluster(0)
    # 4 idle cards, but inference has a limit of 2: raising it (and its guarantee) to 4 lets the job start.
    snapshot = b.snapshot(
        snapshot.nodes[:0] or [b.node("n1", gpus=8, model="A100-80GB")],
        running_jobs=snapshot.running,
        pending=snapshot.pending,
        quotas=[
            b.quota("ai-lab/training", guaranteed_gpus=4, limit_gpus=8),
            b.quota("ai-lab/inference", guaranteed_gpus=1, limit_gpus=2),
        ],
    )
    row = _quota(teams["inference"])
    row.guaranteed_gpus, row.limit_gpus = Decimal(4), Decimal(4)
    row.limit_gpu_memory_mib = None
    impact = quota_impact(row=row, snapshot=snapshot)
    assert [j.job_id for j in impact.would_start] == [3]
    assert not impact.over_committed


def test_guarantees_beyond_the_installed_cards_are_flagged_over_committed(teams):
    row = _quota(teams["inference"])
    row.guaranteed_gpus, row.limit_gpus = Decimal(6), Decimal(8)
    impact = quota_impact(row=row, snapshot=_cluster(1))
    assert [line.scope for line in impact.over_committed] == ["all GPU models"]
    assert impact.capacity[0].guaranteed_gpus_after == 10 and impact.capacity[0].gpus == 8
