"""Integration fixtures: farms of real OpenSSH "GPU hosts" (tests/support/testhosts/).

``farm = host_farm(n=3, gpus=2)`` returns a started HostFarm, torn down (by pid and namespace name)
when the test ends; ``host_farm_module`` is the same factory with module scope, for read-only tests
that can share hosts.  A machine that cannot run them (not root, no sshd/iproute2/util-linux) fails
the test with the fix in the message: CI must run these, so they never skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.gpuquser import User
from tests.support.ledger_invariants import check_all
from tests.support.testhosts import FarmFactory, HostFarm, requirements_problem


@pytest.fixture(autouse=True)
def ledger_invariants(tmp_path: Path) -> Iterator[None]:
    """After every integration test, each ledger it left holds the invariants of
    tests/support/ledger_invariants.py (an attempt always ends with its job; docs/cost.md)."""
    yield
    broken = check_all(tmp_path)
    assert not broken, "ledger invariant broken:\n" + "\n".join(broken)


def _factory(base: Path) -> tuple[FarmFactory, list[HostFarm]]:
    farms: list[HostFarm] = []

    def make(n: int = 2, gpus: int = 2, **kw: Any) -> HostFarm:
        problem = requirements_problem()
        if problem:
            pytest.fail(problem, pytrace=False)
        farm = HostFarm(base / f"farm{len(farms)}", n, gpus, **kw)
        farms.append(farm)
        return farm.start()

    return make, farms


@pytest.fixture
def host_farm(tmp_path: Path) -> Iterator[FarmFactory]:
    make, farms = _factory(tmp_path)
    yield make
    for farm in farms:
        farm.teardown()


@pytest.fixture(scope="module")
def host_farm_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FarmFactory]:
    make, farms = _factory(tmp_path_factory.mktemp("farms"))
    yield make
    for farm in farms:
        farm.teardown()


@pytest.fixture
def user(farm: HostFarm, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[User]:
    """A gpuq user with a home of their own, working against the requesting module's ``farm``; every
    process they started on the hosts is killed afterwards (a module may define its own ``user``)."""
    home = tmp_path / "gpuq-home"
    home.mkdir()
    u = User(farm, home, f"/root/gpuq-{request.node.name[:40]}")
    yield u
    u.stop_everything()
