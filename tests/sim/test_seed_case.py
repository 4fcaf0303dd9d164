"""The seed's case study, simulated through the production engine: the figures come from the run, the test
checks them against the seed's outcome (45% -> 82% utilization, training wait over 2 h -> under 10 min)."""

from __future__ import annotations

import json

import pytest

from scheduling.sim import cli_dynamic
from scheduling.sim.cli_dynamic import main_scenario, run_scenario


@pytest.fixture(scope="module")
def seed_run():
    """The 8-hour scenario, run once for the whole module: (scenario, results, summary)."""
    return run_scenario("seed-case")


@pytest.fixture(scope="module")
def seed_case(seed_run):
    _, results, summary = seed_run
    return results, summary


def test_whole_card_fifo_shows_the_seeds_low_utilization_and_a_training_wait_over_two_hours(seed_case):
    _, summary = seed_case
    fifo = summary["policies"]["whole-card-fifo"]
    assert 0.40 <= fifo["utilization"] <= 0.50, fifo["utilization"]
    assert fifo["training_wait_s"] >= 2 * 3600
    assert fifo["preemptions"] == 0
    # Cards are handed out (allocation is high) but a tenth-used inference server holds each of 20 cards.
    assert fifo["allocation"] - fifo["utilization"] > 0.3


def test_tessera_reaches_82_percent_utilization_and_starts_training_within_ten_minutes(seed_case):
    _, summary = seed_case
    tessera = summary["policies"]["tessera"]
    assert tessera["utilization"] >= 0.82, tessera["utilization"]
    assert tessera["training_started"] is True
    assert tessera["training_wait_s"] <= 600


def test_tessera_packs_the_twenty_inference_jobs_onto_two_cards(seed_case):
    results, _ = seed_case
    tessera = results["tessera"]
    cards = {(a.node, a.gpu_index) for r in tessera.jobs if r.spec.kind == "inference" for a in r.assignments}
    assert len(cards) == 2


def test_training_lands_on_one_nvlink_island_under_both_policies(seed_case):
    results, _ = seed_case
    for result in results.values():
        (training,) = [r for r in result.jobs if r.spec.kind == "training"]
        assert training.first_start_s is not None
        assert len(training.assignments) == 8
        assert len({a.node for a in training.assignments}) == 1


def test_the_command_prints_allocation_utilization_and_training_wait_per_policy(
    capsys, tmp_path, monkeypatch, seed_run
):
    asked = []

    def run_once_more(name, **options):  # the command's own run would repeat the module's: reuse it
        asked.append(name)
        return seed_run

    monkeypatch.setattr(cli_dynamic, "run_scenario", run_once_more)
    assert main_scenario(["seed-case", "--json", "--out", str(tmp_path), "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    for name in ("whole-card-fifo", "tessera"):
        figures = out["policies"][name]
        assert 0 <= figures["allocation"] <= 1 and 0 <= figures["utilization"] <= figures["allocation"]
        assert figures["training_wait_s"] is not None
    written = {p.name for p in (tmp_path / "seed-case").iterdir()}
    assert {"summary.json", "utilization.png", "queue.png", "wait-by-team.png", "tessera-jobs.csv"} <= written
    assert asked == ["seed-case"]
