"""The static replay on the real openb default trace (one seed) ranks FGD, BestFit and Random as published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduling.engine.openb_profiles import openb_profile
from scheduling.sim.cli_static import main_static
from scheduling.sim.openb import load_nodes, load_pods
from scheduling.sim.static import run_static_seed

TRACE = Path(__file__).resolve().parents[2] / "../shared/traces/openb"
NODES = TRACE / "openb_node_list_gpu_node.csv"
PODS = TRACE / "openb_pod_list_default.csv"

needs_trace = pytest.mark.skipif(
    not (NODES.is_file() and PODS.is_file()),
    reason=f"the openb trace is not beside the repository ({TRACE.resolve()}); see shared/traces/openb/README.md",
)


@needs_trace
@pytest.mark.slow
def test_fgd_leaves_less_unallocated_than_bestfit_and_bestfit_less_than_random_and_tessera_beats_fgd():
    nodes, pods = load_nodes(NODES), load_pods(PODS)
    unallocated = {
        policy: run_static_seed(nodes, pods, profile=openb_profile(policy), seed=42).unallocated_pct_at_100
        for policy in ("tessera", "fgd", "bestfit", "random")
    }
    assert unallocated["tessera"] < unallocated["fgd"] < unallocated["bestfit"] < unallocated["random"]


@needs_trace
def test_the_cli_prints_the_published_measures_as_json(capsys, tmp_path):
    # A slice of the real lists keeps this quick; the protocol is the same.
    small = tmp_path / "pods.csv"
    small.write_text("\n".join(PODS.read_text().splitlines()[:300]) + "\n")
    few = tmp_path / "nodes.csv"
    few.write_text("\n".join(NODES.read_text().splitlines()[:61]) + "\n")
    assert (
        main_static(
            ["--nodes", str(few), "--pods", str(small), "--policy", "tessera", "--seeds", "42-43", "--json"]
        )
        == 0
    )
    result = json.loads(capsys.readouterr().out)
    assert result["seeds"] == [42, 43] and len(result["per_seed"]) == 2
    assert 0.0 <= result["unallocated_pct_at_100"] <= 100.0
    # Nothing is allocated that did not arrive (a point averages arrivals that round to it, hence the half).
    assert all(alloc <= int(arrival) + 0.5 for arrival, alloc in result["alloc_curve"].items())
    assert int(max(result["alloc_curve"], key=int)) >= 130


def test_the_cli_names_the_bad_row_of_a_malformed_trace(capsys, tmp_path):
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,lots,1,1,T4\n")
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\n")
    assert main_static(["--nodes", str(nodes), "--pods", str(pods), "--policy", "fgd", "--json"]) == 2
    assert "row 2: column 'cpu_milli' is not a number" in capsys.readouterr().err
