"""Scenario files, demand sources, the sampled fault mix and the ground truth."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from agents.sim.demand import AzureTraceDemand, DemandFormatError, RateCsvDemand, SyntheticDemand
from agents.sim.fault_mix import read_episodes, sample_faults
from agents.sim.scenario import (
    FaultKind,
    SampleSpec,
    Scenario,
    ScenarioError,
    load_scenario,
)
from agents.sim.simulation import Simulation
from tests.factories import START

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO / "scenarios").glob("*.yaml"))
EPISODES = REPO / "scenarios/data/gpu-faults/derived_fault_episodes.csv"
RATES = REPO / "scenarios/data/servegen/rates_2days.csv"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_shipped_scenario_loads_binds_and_runs(path: Path) -> None:
    sim = Simulation(load_scenario(path), start=START)
    assert sim.ticks is None if path.stem == "steady" else sim.ticks
    for n in range(5):
        assert sim.tick(n)


def test_the_shipped_scenarios_cover_every_fault_kind() -> None:
    kinds = set()
    for path in SCENARIOS:
        sim = Simulation(load_scenario(path), start=START)
        kinds |= {f.spec.kind for f in sim.faults.resolved}
    assert kinds == set(FaultKind)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("faults: [{kind: ecc_storm, start_s: 1, duration_s: 5}]", "give target.node and .device"),
        (
            "faults: [{kind: node_crash, target: {node: 1}, start_s: 1, duration_s: 5,"
            " params: {speed: 2}}]",
            "unknown params ['speed']",
        ),
        ("faults: [{kind: nope, start_s: 1, duration_s: 5}]", "kind"),
        (
            "faults: [{kind: ecc_storm, target: {node: 0, device: 0}, start_s: 1, duration_s: 50,"
            " params: {lead_s: 100}}]",
            "lead_s",
        ),
        (
            "faults: [{kind: thermal_runaway, target: {node: 0, device: 0}, start_s: 1,"
            " duration_s: 5}]",
            "targets a node: give target.node alone",
        ),
        (
            "faults: [{kind: power_brake, target: {rack: 0, node: 1}, start_s: 1, duration_s: 5}]",
            "targets a rack: give target.rack alone",
        ),
        ("demand: {kind: rate-csv}", "needs a path"),
        ("flet: {nodes: 3}", "flet"),
        ("- just\n- a list", "a scenario is a mapping"),
        (
            "faults: [{kind: demand_spike, target: {region: mars}, start_s: 1, duration_s: 5}]",
            "unknown region 'mars'",
        ),
        (
            "faults: [{kind: node_crash, target: {node: 99}, start_s: 1, duration_s: 5}]",
            "node 99 but the fleet has 10",
        ),
    ],
)
def test_bad_scenarios_say_why(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=None) as info:
        Simulation(load_scenario(path), start=START)
    assert message in str(info.value)


def test_data_paths_resolve_beside_the_scenario_file() -> None:
    scenario = load_scenario(REPO / "scenarios/fault-mix.yaml")
    assert scenario.demand.path == REPO / "scenarios/data/servegen/rates_2days.csv"
    assert scenario.sample_faults is not None and scenario.sample_faults.path.exists()


def test_synthetic_demand_is_a_pure_function_of_time_and_seed() -> None:
    a, b = SyntheticDemand(seed=1), SyntheticDemand(seed=1)
    times = [t * 7.3 for t in range(2000)]
    forward = [a.at("qwen-7b", "us-east", t).rps for t in times]
    backward = [b.at("qwen-7b", "us-east", t).rps for t in reversed(times)]
    assert forward == list(reversed(backward))
    assert forward != [SyntheticDemand(seed=2).at("qwen-7b", "us-east", t).rps for t in times]
    assert min(forward) >= 0 and max(forward) > 1.3  # diurnal swing plus bursts
    mean = sum(forward) / len(forward)
    assert 0.9 < mean < 1.3


def test_rate_csv_maps_models_and_wraps_around() -> None:
    d = RateCsvDemand(
        RATES,
        models=("llama-70b", "mixtral-8x7b", "qwen-7b"),
        region_shares={"us-east": 0.6, "eu-west": 0.4},
    )
    first = d.at("llama-70b", "us-east", 0.0).rps
    assert first == pytest.approx(212.78 * 0.6)  # m-large's first window, us-east share
    assert d.at("llama-70b", "us-east", 2 * 86400.0).rps == pytest.approx(first)  # wrapped
    assert d.at("gemma-27b", "us-east", 0.0).rps == 0.0
    assert d.mean_rps("qwen-7b", "eu-west") > 0


def test_azure_trace_is_binned_per_second_with_mean_lengths(tmp_path: Path) -> None:
    trace = tmp_path / "azure.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:46.9000000,626,56\n"
        "2023-11-16 18:15:49.1000000,100,10\n"
    )
    d = AzureTraceDemand(trace, model="llama-70b", region_shares={"us-east": 1.0})
    second0 = d.at("llama-70b", "us-east", 0.5)
    assert second0.rps == 2.0 and second0.prompt_tokens == 500 and second0.generated_tokens == 50
    assert d.at("llama-70b", "us-east", 1.5).rps == 0.0
    assert d.at("llama-70b", "us-east", 2.5).rps == 1.0
    trace.write_text("when,ContextTokens\n1,2\n")
    with pytest.raises(DemandFormatError, match="Azure LLM trace needs columns"):
        AzureTraceDemand(trace, model="llama-70b", region_shares={"us-east": 1.0})


def test_fault_mix_follows_the_real_episodes_and_is_seeded() -> None:
    episodes = read_episodes(EPISODES)
    kinds = {e.kind for e in episodes}
    assert FaultKind.ECC_STORM in kinds and FaultKind.NODE_CRASH in kinds
    spec = SampleSpec(path=EPISODES, count=30, seed=5)
    a = sample_faults(spec, nodes=20, devices_per_node=8, racks=5, horizon_s=1800)
    b = sample_faults(spec, nodes=20, devices_per_node=8, racks=5, horizon_s=1800)
    assert a == b and len(a) == 30
    assert all(f.start_s >= 60 and f.end_s <= 1800 + 1 for f in a)
    # each lasts its repair time; a storm's correctable errors run before the double-bit fault
    storms = [f for f in a if f.kind is FaultKind.ECC_STORM]
    assert storms and all(f.params["lead_s"] == 300.0 for f in storms)
    assert all(120 <= f.duration_s - f.params.get("lead_s", 0.0) <= 900 for f in a)
    by_kind = {f.kind for f in a}
    assert FaultKind.ECC_STORM in by_kind  # the most frequent mapped kind in the file


def test_ground_truth_lists_faults_and_what_they_caused(tmp_path: Path) -> None:
    sim = Simulation(load_scenario(REPO / "scenarios/ecc-storm.yaml"), start=START)
    for n in range(430):
        sim.tick(n)
    out = tmp_path / "truth.jsonl"
    sim.write_truth(out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    fault, consequence = rows
    assert fault["kind"] == "ecc_storm" and fault["device_uuid"] == "node-00000-gpu1"
    assert fault["start_at"] == (START + timedelta(seconds=120)).isoformat()
    assert fault["params"]["lead_s"] == 300
    assert consequence == {
        "record": "consequence",
        "t_s": 420.0,
        "what": "double_bit_ecc",
        "target": "node-00000-gpu1",
        "at": (START + timedelta(seconds=420)).isoformat(),
    }


def test_a_steady_scenario_by_default() -> None:
    assert Scenario().faults == () and Scenario().demand.kind == "synthetic"
