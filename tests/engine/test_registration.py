"""Plugin classes are held to the engine's hook protocols when they are registered: what the engine would
misread (a misspelt hook it would never call, a hook with other arguments) fails loudly there."""

from __future__ import annotations

import pytest

from scheduling.engine import run_cycle
from scheduling.engine.hooks import PluginError, check_plugin_class
from scheduling.engine.plugins import REGISTRY, register
from scheduling.engine.plugins.fits import Fits
from tests.engine.builders import job, node, profile, snapshot


def _admit_plugin(**methods):
    def admit(self, ctx, job):
        return None

    return type("TestAdmit", (), {"NAME": "test-admit", "admit": admit, **methods})


def test_every_builtin_plugin_passes_the_registration_checks() -> None:
    for cls in REGISTRY.values():
        check_plugin_class(cls)


def test_a_misspelt_hook_on_an_admit_plugin_is_refused_at_registration() -> None:
    cls = _admit_plugin(admit_charg=lambda self, ctx, job, charge: None)
    with pytest.raises(
        PluginError, match=r"admit_charg\(\) is not a hook of the engine; did you mean admit_charge"
    ):
        register(cls)
    assert "test-admit" not in REGISTRY


def test_a_public_helper_method_is_refused_and_a_private_one_is_fine() -> None:
    with pytest.raises(PluginError, match=r"public method describe\(\) is not a hook"):
        check_plugin_class(_admit_plugin(describe=lambda self: "helper"))
    check_plugin_class(_admit_plugin(_describe=lambda self: "helper"))


def test_a_hook_with_the_wrong_arguments_is_refused() -> None:
    cls = _admit_plugin(admit_charge=lambda self, ctx, job: None)
    with pytest.raises(PluginError, match=r"does not take the arguments of AdmitChargeHook.admit_charge"):
        check_plugin_class(cls)
    too_many = _admit_plugin(borrowed=lambda self, ctx, job, charge, extra: False)
    with pytest.raises(PluginError, match=r"BorrowedHook.borrowed"):
        check_plugin_class(too_many)


def test_a_hook_with_extra_optional_arguments_is_accepted() -> None:
    check_plugin_class(_admit_plugin(borrowed=lambda self, ctx, job, charge, verbose=False: False))


def test_cacheable_must_be_a_bool() -> None:
    score = type(
        "TestScore",
        (),
        {"NAME": "test-score", "CACHEABLE": "no", "score_node": lambda self, ctx, job, node: 0.0},
    )
    with pytest.raises(PluginError, match=r"CACHEABLE must be a bool, not 'no'"):
        register(score)


def test_half_of_the_model_restriction_hook_is_refused() -> None:
    cls = _admit_plugin(restrict_models=lambda self, ctx, job: None)
    with pytest.raises(PluginError, match=r"restricted_teams\(\).*ModelRestrictionHook needs both"):
        check_plugin_class(cls)


def test_a_class_implementing_no_extension_point_is_refused() -> None:
    cls = type("TestNothing", (), {"NAME": "test-nothing", "CACHEABLE": True})
    with pytest.raises(PluginError, match="implements no extension point"):
        check_plugin_class(cls)


class _CountingBatchScore:
    """A non-cacheable node score that scores every query's nodes in one call."""

    NAME = "test-counting-batch"
    CACHEABLE = False
    calls: list[str] = []

    def score_node(self, ctx, job, node):
        self.calls.append("one")
        return 0.0

    def score_nodes(self, ctx, job, nodes):
        self.calls.append("many")
        return [1.0 if n.name == "b" else 0.0 for n in nodes]


def test_a_batch_node_scorer_is_called_once_per_query_instead_of_per_node() -> None:
    register(_CountingBatchScore)
    _CountingBatchScore.calls.clear()
    p = profile(fields={"node_scores": (("test-counting-batch", 1.0),), "actions": ("allocate",)})
    decisions = run_cycle(snapshot([node("a", gpus=1), node("b", gpus=1)], pending=[job("j", gpus=1)]), p)
    assert {a.node for a in decisions.placements[0].assignments} == {"b"}
    assert _CountingBatchScore.calls == ["many"]


def test_the_fits_filter_is_left_to_the_node_index(monkeypatch) -> None:
    def never(self, ctx, job, node):
        raise AssertionError("the node index applies the fit rule itself")

    monkeypatch.setattr(Fits, "filter", never)
    p = profile(fields={"filters": ("fits",)})
    decisions = run_cycle(snapshot([node("a", gpus=1)], pending=[job("j", gpus=1), job("k", gpus=2)]), p)
    assert [pl.job_id for pl in decisions.placements] == ["j"]
    assert decisions.pending[0].status.code == "insufficient-gpus"
