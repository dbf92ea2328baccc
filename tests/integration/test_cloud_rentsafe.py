"""Issue 38, items 5-7, end to end (the CLI against the fake RunPod, tests/integration/test_cloud_billing.py's rig):
an ambiguous create rents one machine and loses none; a row a killed `gpuq up` left `provisioning` is ended by the
next tick; a machine priced above `--max-price` after its create is ended before use (no job runs: the machines
stand on the fake's AddressBackend and never need SSH); the user's monthly cap stops dispatch across sweeps (the
light trainer on the embedded local host, priced)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator import api
from tests.conftest import wait_for
from tests.integration.test_budget_holds import ENV, PRICE, _events, _ok, _states, _status, _until
from tests.integration.test_cloud_billing import GPU, Rig, _wait_for_id, key, rig
from tests.support.lightproject import light_config, light_project

pytestmark = pytest.mark.integration
__all__ = ["key", "rig"]  # the rig's fixtures, shared


def _pod_creates(cloud: Rig) -> int:
    return len([r for r in cloud.fake.requests() if r.get("method") == "POST" and r.get("path", "").endswith("/pods")])


def test_an_ambiguous_create_rents_one_machine_and_loses_none(rig: Callable[..., Rig]) -> None:
    cloud = rig()
    cloud.env.update({"GPUQ_CREATE_LOOKUP_S": "60", "GPUQ_PROVIDER_READY_TIMEOUT_S": "1"})
    cloud.fake.slow_ready(port_polls=10**6)  # never ready: up ends what it found
    cloud.fake.fail_after_create(1, status=500, retry_after=None, listing_lag_s=2.0)
    out = cloud.gpuq(*cloud.up_args())
    (row,) = cloud.rows().values()
    assert _pod_creates(cloud) == 1, "no second create while the first's answer was an error"
    assert len(cloud.fake.pods) <= 1 and cloud.billing() == {}, out.stdout + out.stderr
    assert row.instance_id and row.lease_state == "terminated", (row, out.stderr)


def test_a_row_left_provisioning_by_a_killed_up_is_ended_by_the_next_tick(rig: Callable[..., Rig]) -> None:
    cloud = rig()
    cloud.fake.slow_ready(port_polls=10**6)
    proc = cloud.spawn(*cloud.up_args())
    try:
        row = _wait_for_id(cloud)
        proc.kill()  # SIGKILL during the readiness wait: nothing of gpuq runs after this
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert cloud.rows()[row.name].lease_state == "provisioning" and cloud.billing() != {}
    cloud.env.update({"GPUQ_CREATE_LOOKUP_S": "0", "GPUQ_PROVIDER_READY_TIMEOUT_S": "1"})  # the window: 2 s
    assert wait_for(lambda: time.time() > row.lease_changed_at + 2.5, timeout=30, interval=0.2)
    status = cloud.gpuq("status", "--once")
    assert cloud.billing() == {}, status.stdout + status.stderr
    assert cloud.rows()[row.name].lease_state == "terminated"


def test_a_machine_priced_above_max_price_once_created_is_ended_before_use(rig: Callable[..., Rig]) -> None:
    cloud = rig()
    gpu = cloud.fake.gpu_types[GPU["runpod"]]
    cloud.fake.slow_ready(port_polls=10**6)
    proc = cloud.spawn(*cloud.up_args("--max-price", f"{gpu.secure_price:.2f}"))
    try:
        row = _wait_for_id(cloud)
        with cloud.fake.lock:  # the pod the provider made bills more than the catalog said before the create
            gpu.secure_price = gpu.community_price = 2.37
            cloud.fake.pods[row.instance_id].port_polls = 0
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out + err
    assert "priced $2.37/h once created, above --max-price" in err and "gpuq terminated it" in err, err
    assert cloud.billing() == {} and cloud.rows()[row.name].lease_state == "terminated"


def test_the_monthly_cap_stops_dispatch_across_sweeps(gpuq_home: Path, tmp_path: Path) -> None:
    """The embedded local host priced like a rented one ($0.10 a second), the light trainer: a first sweep
    spends past a $0.05 `budget_usd_month`; a second sweep, capped by nothing of its own, starts nothing."""
    ctx = api.open_context()
    try:
        ctx.ledger.ensure_host("local", kind="local", root=str(gpuq_home / "local"))
        ctx.ledger.update_host("local", price_per_hour=PRICE, gpu_count=1)
    finally:
        ctx.close()
    first = light_project(tmp_path / "a", {"tiny": light_config(steps=3, step_s=0.3)},
                          ["configs/tiny.yaml classify 1 name=first"])
    _ok("submit", str(first))
    assert set(_states(_until({"first"}, "SUCCEEDED")).values()) == {"SUCCEEDED"}
    capped = {**ENV, "GPUQ_BUDGET_USD_MONTH": "0.05"}
    second = light_project(tmp_path / "b", {"tiny": light_config(steps=1, step_s=0.1)},
                           ["configs/tiny.yaml classify 1 name=second"])
    _ok("submit", str(second), env=capped)
    doc = _status(env=capped)
    assert _states(doc)["second"] == "QUEUED", doc["jobs"]
    (job,) = [j for j in doc["jobs"] if j["name"] == "second"]
    assert "still queued: budget_usd_month: $" in _events(gpuq_home, job["id"])[-1]
    assert [a["severity"] for a in doc["alerts"] if a["rule"] == "budget_month"] == ["escalate"], doc["alerts"]
