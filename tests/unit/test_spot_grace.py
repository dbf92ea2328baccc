"""A spot host's preemption grace reaches the job spec from the platform profile."""

from __future__ import annotations

from orchestrator.agent.launcher import sigterm_grace_s
from orchestrator.ledger import HostRow


def _row(**kw: object) -> HostRow:
    base: dict[str, object] = {"name": "h", "kind": "ssh", "root": "/r", "created_at": 0.0}
    base.update(kw)
    return HostRow(**base)  # type: ignore[arg-type]


def test_on_demand_hosts_wait_for_kill_grace() -> None:
    assert sigterm_grace_s(None) is None
    assert sigterm_grace_s(_row(profile="runpod", provider="runpod", spot=False)) is None


def test_a_runpod_spot_pod_has_five_seconds() -> None:
    assert sigterm_grace_s(_row(profile="runpod", provider="runpod", spot=True)) == 5.0


def test_a_profile_without_spot_falls_back_to_the_provider_profile() -> None:
    # a rehearsal pod rented as spot: the rehearsal profile knows no spot; RunPod's does
    assert sigterm_grace_s(_row(profile="rehearsal", provider="runpod", spot=True)) == 5.0


def test_an_undocumented_spot_grace_is_none_at_all() -> None:
    assert sigterm_grace_s(_row(profile="ssh", provider="", spot=True)) == 0.0
