"""An exit-0 record says what was checked (issue 39 item 6): the artifacts ``verify`` named, or that none
were, and the controller's reason says it once (not "trained, artifacts verified" twice)."""

from __future__ import annotations

from orchestrator.host_documents.status import ExitRecord
from orchestrator.tick.attempts import exit_message
from tests.support.agentmodule import load_agent_module

wrap = load_agent_module("gpuq_attempt.gpuq_wrap")


def test_nothing_checked_is_not_called_verified() -> None:
    said = wrap.checked_message(())
    assert "verified" not in said
    assert "no artifacts checked" in said


def test_the_checked_artifacts_are_named() -> None:
    said = wrap.checked_message(("metrics", "best_ckpt"))
    assert said == "artifacts verified: metrics, best_ckpt"


def test_the_reason_is_said_once() -> None:
    line = exit_message(ExitRecord(wrapper_code=0, message=wrap.checked_message(())))
    assert line == "exit 0: trained: no artifacts checked (verify = [])"
    old = exit_message(ExitRecord(wrapper_code=0, message="trained, artifacts verified"))
    assert old.count("trained") == 1
