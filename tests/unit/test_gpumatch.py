"""Hardware as a constraint (orchestrator/scheduling/gpumatch.py): the model-name rule, GiB per GPU, unknown GPUs,
the reason no host matches, and the agent's copy of the rule (payload/agent/gpuq_verbs/gpuq_health_checks.py)."""

from __future__ import annotations

import pytest

from orchestrator.scheduling import gpumatch as G
from tests.support.agentmodule import load_agent_module

H = load_agent_module("gpuq_verbs.gpuq_health_checks")

A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
A10 = "NVIDIA A10"
RTX = "NVIDIA GeForce RTX 4090"
L40S = "NVIDIA L40S"

MATCHES = [
    ("A100", A100, True), ("a100", A100, True), ("A100-SXM4", A100, True), ("sxm4_80gb", A100, True),
    ("A10", A100, False), ("A1", A100, False), ("A100-80GB", A100, False), ("H100", A100, False),
    ("H100", H100, True), ("h100.80gb", H100, True), ("A10", A10, True), ("A100", A10, False),
    ("RTX4090", RTX, True), ("rtx-4090", RTX, True), ("4090", RTX, True), ("GeForceRTX", RTX, True),
    ("L40", L40S, False), ("L40S", L40S, True), ("nvidia", L40S, True), ("---", A100, False),
    ("VIDIA", A100, False), ("100", A100, False),
]


@pytest.mark.parametrize(("wanted", "name", "expected"), MATCHES)
def test_a_model_names_whole_words_of_the_card(wanted: str, name: str, expected: bool) -> None:
    assert G.model_matches(wanted, name) is expected
    assert H.model_matches(wanted, name) is expected  # the agent's copy agrees


def test_a_host_matches_when_every_gpu_does_and_its_smallest_has_the_memory() -> None:
    need = G.GpuNeed(("A100", "H100"), 79.0)
    assert G.host_matches(need, (A100,), 81920.0)
    assert G.host_matches(need, (A100, H100), 81559.0)  # both models asked for; 85.5 GB >= 79
    assert not G.host_matches(need, (A100, A10), 23028.0)  # one GPU is neither
    assert G.host_matches(G.GpuNeed((), 80.0), (H100,), 81559.0)  # an "80 GB" H100: 79.6 GiB, but 85.5 GB
    assert G.host_matches(G.GpuNeed((), 24.0), (A10,), 23028.0)  # a "24 GB" A10 reports 24.1 GB
    assert not G.host_matches(G.GpuNeed((), 25.0), (A10,), 23028.0)
    assert not G.host_matches(G.GpuNeed((), 86.0), (H100,), 81559.0)
    assert not G.host_matches(need, None, None)  # unknown
    assert not G.host_matches(need, (), None)  # no GPUs
    assert not G.host_matches(G.GpuNeed((), 1.0), (A100,), None)  # memory unknown
    assert G.host_matches(G.ANY_GPU, None, None) and not G.ANY_GPU


def test_the_reason_names_what_is_asked_and_every_host() -> None:
    hosts = [G.HostGpus("a", (A10,), 23028.0), G.HostGpus("b", (A100,), 81920.0), G.HostGpus("c", None)]
    assert G.unmet(G.GpuNeed(("H100",)), hosts) == (
        "needs gpu=H100: no host has one (hosts: a: NVIDIA A10 24.1 GB, b: NVIDIA A100-SXM4-80GB 85.9 GB, "
        "c: GPUs not known yet); 1 of them not probed yet (`gpuq status` probes them)")
    assert G.unmet(G.GpuNeed((), 96.0), hosts[:2]).startswith("needs gpu_mem=96: no host has that much GPU memory")
    held = [G.HostGpus("b", (A100,), 81920.0, usable=False, reason="held: unhealthy")]
    assert G.unmet(G.GpuNeed(("A100", "H100"), 40.5), held) == (
        "needs gpu=A100|H100 gpu_mem=40.5: the hosts that match are not usable (b held: unhealthy)")
    many = [G.HostGpus(f"h{i}", (A10,), 23028.0) for i in range(12)]
    assert G.unmet(G.GpuNeed(("H100",)), many).endswith("h7: NVIDIA A10 24.1 GB and 4 more)")


def test_the_ledger_keeps_each_gpu_and_reads_back_models_and_the_smallest_memory() -> None:
    text = G.facts_json([(A100, 81920.0), (A10, 23028.0), ("x\x1b[31m", float("nan"))])
    assert G.read_facts(text) == ((A10, A100, "x[31m"), None)  # one memory unknown: the smallest is unknown
    assert G.read_facts(G.facts_json([(A100, 81920.0), (A100, 81000.0)])) == ((A100,), 81000.0)
    assert G.read_facts(G.facts_json([])) == ((), None)
    for bad in ("", "{", "{}", "[[1, 2]]", '["A100"]'):
        assert G.read_facts(bad) == (None, None)


def test_a_preflight_gets_the_strictest_ask_of_the_jobs_on_its_host() -> None:
    same = G.strictest([G.GpuNeed(("A100",), 40.0), G.GpuNeed(("A100",), 70.0), G.ANY_GPU])
    assert same == G.GpuNeed(("A100",), 70.0)
    mixed = G.strictest([G.GpuNeed(("A100",)), G.GpuNeed(("A100", "H100"), 20.0)])
    assert mixed == G.GpuNeed((), 20.0)  # models differ: the scheduler checked each job; memory still checked
    assert not G.strictest([G.ANY_GPU])
    assert G.need_of("A100|H100", None) == G.need_of(("A100", "H100"), None) == G.GpuNeed(("A100", "H100"))
    assert not G.need_of("", None)


def test_the_agent_identity_check_takes_several_models() -> None:
    gpu = {"index": 0, "name": A100, "memory_total_mib": 81920.0}
    assert H.check_identity([gpu], ["H100", "A100"], 81920.0)[0] == "pass"
    status, detail = H.check_identity([gpu], ["H100", "A10"], None)
    assert status == "warn" and "'H100' or 'A10'" in detail
    assert H.check_identity([gpu], ["A100"], 90000.0)[0] == "fail"
