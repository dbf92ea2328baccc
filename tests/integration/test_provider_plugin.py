"""A provider from outside gpuq is all a new provider needs: the tests' toy provider (its adapter and registry
entry in tests/support/toycloud.py, its fake in tests/support/fakecloud/toy.py, its profile in
tests/fixtures/providers/toy/), named in GPUQ_PROVIDER_PLUGINS, rents a machine with `gpuq up`, shows in the
JSON documents and `gpuq down` ends it.  The machine is a real SSH host in a network namespace."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import run_gpuq
from tests.support.fakecloud.netns_backend import NetnsBackend
from tests.support.fakecloud.toy import FakeToy
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration

KEY = "toy-test-key-0123456789"


def test_gpuq_up_and_down_with_a_provider_only_the_tests_know(host_farm: Callable[..., HostFarm],
                                                              tmp_path: Path) -> None:
    farm = host_farm(n=1, gpus=1)
    home = tmp_path / "gpuq-home"
    home.mkdir()
    with NetnsBackend(farm) as backend, FakeToy(api_key=KEY, backend=backend) as fake:
        env = {"GPUQ_HOME": str(home), "GPUQ_SSH_KEY": str(farm.client_key), "GPUQ_PROVIDER_POLL_S": "0.2",
               "GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_PROVIDER_PLUGINS": "tests.support.toycloud",
               "TOY_API_KEY": KEY, "GPUQ_TOY_URL": fake.url}
        up = run_gpuq("up", "--provider", "toy", "--gpu", "toy-1", env=env, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "toy toy-" in up.stdout and "preflight PASS" in up.stdout and "$0.11/h" in up.stdout, up.stdout
        (machine,) = fake.machines.values()
        listed = run_gpuq("status", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        (host,) = [h for h in json.loads(listed.stdout)["hosts"] if h["name"] != "local"]
        assert host["provider"] == "toy" and host["instance_id"] == machine.id
        ledger = Ledger(home / "ledger.db")
        try:
            (row,) = [r for r in ledger.hosts() if r.provider == "toy"]
            assert row.profile == "toy" and row.lease_state == "running" and row.price_per_hour == 0.11
        finally:
            ledger.close()
        down = run_gpuq("down", host["name"], "--yes", env=env)
        assert down.returncode == 0 and f"{host['name']}: terminated" in down.stdout, down.stdout + down.stderr
        assert fake.machines == {} and ("destroy", machine.id, 0.0) in backend.events
        orphans = run_gpuq("down", "--orphans", "--yes", env=env)  # the toy account is scanned too
        assert orphans.returncode == 0 and "no orphaned instances" in orphans.stdout, orphans.stdout + orphans.stderr
        assert [e["op"] for e in fake.requests()][-1] == "GET /toy/machines"
