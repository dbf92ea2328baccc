"""The outbound job spec on both sides of the wire (issue 44): the controller's frozen dataclass
(orchestrator/agent/spec.py) turned into JSON, the agent's one parser (payload/agent/gpuq_base/gpuq_jobspec.py)
reading it back to the same values, and a spec that is missing a field or has one of the wrong type
refused with that field named, by enqueue and by the serving loop alike."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.agent import launcher
from orchestrator.agent.spec import OutboundSpec
from orchestrator.core import protocol
from orchestrator.core.config import Settings
from orchestrator.ledger import Attempt, Job
from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import JOB, outbound_spec, spec_doc

jobspec = load_agent_module("gpuq_base.gpuq_jobspec")
inbox = load_agent_module("gpuq_records.gpuq_inbox")
serve = load_agent_module("gpuq_serving.gpuq_serve")
files = load_agent_module("gpuq_base.gpuq_files")
P = load_agent_module("gpuq_base.gpuq_protocol")

# the keys every spec carries, in the order the controller has always written them (optional ones: run
# ``sigterm_grace_s`` and ``retry`` ahead, ``node`` last, each only when set)
WIRE_KEYS = ["schema", "protocol", "job_id", "name", "queue_id", "attempt", "task", "epochs", "gpus", "nodes", "seed",
             "config", "bundle_sha", "entry", "launcher", "python", "verify", "heartbeat_s", "ckpt_interval_s",
             "kill_grace_s", "min_free_gb", "scratch_gb", "durable_dir", "resume_from", "spec_hash", "env",
             "created_at", "args", "run"]


def _plain(value: Any) -> Any:
    """A dataclass value as plain data (tuples as lists, nested dataclasses and models as dicts): the two
    sides' classes are different classes, their values must be the same."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "document"}
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def test_every_field_the_controller_sets_reaches_the_agent_with_its_value() -> None:
    sent = outbound_spec()
    assert all(getattr(sent, f.name) is not None for f in dataclasses.fields(OutboundSpec)), sent  # every field set
    wire = json.loads(json.dumps(sent.as_document()))
    got = jobspec.parse_spec(wire)
    controller, agent = _plain(sent), _plain(got)
    assert set(controller) <= set(agent)
    assert {k: agent[k] for k in controller} == controller
    assert (agent["started_by"], got.slots, got.own_command) == ("", 2, True)  # the agent's own: set by a host retry
    assert got.document == wire  # what the agent writes back to disk is the JSON as it came


def test_the_wire_keeps_the_keys_and_their_order() -> None:
    doc = outbound_spec().as_document()
    assert list(doc) == ["sigterm_grace_s", "retry", *WIRE_KEYS, "node"]
    bare = outbound_spec(sigterm_grace_s=None, retry=None, node=None, run=None).as_document()
    assert list(bare) == WIRE_KEYS and bare["run"] is None
    assert doc["run"]["data"] == {"train": {"tree": "e" * 64, "file": "train.bin"}}
    assert "data" not in outbound_spec(run=dataclasses.replace(outbound_spec().run, data={})).as_document()["run"]


def test_the_launcher_builds_the_spec_the_protocol_documents() -> None:
    """launcher.job_spec for a job without a sweep: the same document, key for key, as before the dataclass."""
    job = Job(id=JOB, sweep_id="q1", name="a", line=1, raw="", config="c.yaml", config_sha256="", task="cls",
              epochs=0, gpus=1, nodes=1, seed=None, retries=0, spec_hash="h", state="QUEUED", created_at=1.0,
              updated_at=1.0)
    attempt = Attempt(job_id=JOB, number=1, host="h", state="STARTING", bundle_sha="s", created_at=2.0)
    settings = Settings()
    assert launcher.job_spec(job, attempt, settings).as_document() == {
        "schema": protocol.SPEC_SCHEMA, "protocol": protocol.PROTOCOL_VERSION, "job_id": JOB, "name": "a",
        "queue_id": "q1", "attempt": 1, "task": "cls", "epochs": None, "gpus": 1, "nodes": 1, "seed": None,
        "config": "c.yaml", "bundle_sha": "s", "entry": protocol.TRAIN_ENTRY, "launcher": "torchrun", "python": "",
        "verify": ["metrics", "best_ckpt"], "heartbeat_s": settings.heartbeat_s,
        "ckpt_interval_s": settings.ckpt_interval_s, "kill_grace_s": settings.kill_grace_s,
        "min_free_gb": settings.min_free_gb, "scratch_gb": 0, "durable_dir": "", "resume_from": "",
        "spec_hash": "h", "env": {}, "created_at": 2.0, "args": [], "run": None}
    assert jobspec.parse_spec(launcher.job_spec(job, attempt, settings).as_document()).attempt == 1


REQUIRED = ["schema", "job_id", "name", "queue_id", "attempt", "task", "epochs", "gpus", "nodes", "seed", "config",
            "bundle_sha", "entry", "launcher", "python", "verify", "heartbeat_s", "ckpt_interval_s", "kill_grace_s",
            "min_free_gb", "scratch_gb", "durable_dir", "resume_from", "spec_hash", "env", "created_at"]
NULLABLE = {"epochs", "seed", "resume_from"}  # null is a value, absent is not


@pytest.mark.parametrize("field", REQUIRED)
def test_a_spec_missing_a_field_is_refused_with_the_field_named(field: str) -> None:
    doc = {k: v for k, v in spec_doc().items() if k != field}
    with pytest.raises(jobspec.SpecError) as info:
        jobspec.parse_spec(doc)
    assert str(info.value) == (f"{field} is missing" if field != "schema" else
                               f"job spec has no valid schema (None); this agent reads {P.SPEC_SCHEMA}")
    if field in NULLABLE:
        assert getattr(jobspec.parse_spec(spec_doc(**{field: None})), field) is None


@pytest.mark.parametrize(("fields", "named"), [
    ({"name": 3}, "name must be a string, not 3"),
    ({"attempt": True}, "attempt must be an integer >= 1, not True"),
    ({"gpus": "2"}, "gpus must be an integer >= 0 <= 4096, not '2'"),
    ({"epochs": 1.5}, "epochs must be an integer >= 0, not 1.5"),
    ({"verify": "metrics"}, "verify must be a list of strings, not 'metrics'"),
    ({"env": {"A": 1}}, "env must be an object of string values, not {'A': 1}"),
    ({"heartbeat_s": 0}, "heartbeat_s must be a number > 0, not 0"),
    ({"created_at": "now"}, "created_at must be a number >= 0, not 'now'"),
    ({"args": ["--lr", 3]}, "args must be a list of strings, not ['--lr', 3]"),
    ({"run": {"command": "train.py"}}, "run.command must be a list of strings, not 'train.py'"),
    ({"run": {"launcher": "mpirun"}}, "run.launcher must be torchrun or python or none, not 'mpirun'"),
    ({"run": {"data": {"d": {"file": "x"}}}}, "run.data.d.tree is missing"),
    ({"run": []}, "run must be an object or null, not []"),
    ({"retry": {"left": "1", "on": [], "signals": [], "stall_after_s": 1, "startup_grace_s": 1,
                "start_stall_after_s": 1}}, "retry.left must be an integer >= 0, not '1'"),
    ({"retry": {"left": 1, "on": [], "signals": ["KILL"], "stall_after_s": 1, "startup_grace_s": 1,
                "start_stall_after_s": 1}}, "retry.signals must be a list of integers, not ['KILL']"),
    ({"node": {"rank": 0, "nodes": 2, "master_addrs": ["h"], "master_port": 22}},
     "node.master_port must be an integer >= 1024 <= 65535, not 22"),
    ({"schema": "gpuq.job/2"}, "job spec schema gpuq.job/2 is newer than this agent (gpuq.job/1); upgrade the bundle"),
])
def test_a_spec_with_a_field_of_the_wrong_type_is_refused_with_the_field_named(fields: dict[str, Any],
                                                                               named: str) -> None:
    with pytest.raises(jobspec.SpecError) as info:
        jobspec.parse_spec(spec_doc(**fields))
    assert str(info.value) == named


def test_enqueue_refuses_the_whole_order_naming_the_spec_and_its_field(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    order = [spec_doc(job_id="c1"), spec_doc(job_id="c2", kill_grace_s="30")]
    code = inbox.cmd_enqueue(str(tmp_path), io.StringIO(json.dumps(order)))
    err = capsys.readouterr().err
    assert code == P.AGENT_EXIT_USAGE
    assert err == "gpuq enqueue: malformed spec 1 ('c2'): kill_grace_s must be a number >= 0, not '30'\n"
    assert not (tmp_path / P.INBOX_DIR).exists()  # not even the sound one


def test_the_serving_loop_fails_a_bad_inbox_file_with_its_reason_and_keeps_its_bytes(tmp_path: Path) -> None:
    """A spec that reached the inbox some other way than enqueue (a hand-written file, an older
    controller): claimed and failed in phase setup (wrapper code 80) with the field named; the claimed
    copy and spec.json hold the document as it came."""
    lay = files.Layout(str(tmp_path))
    for d in (P.INBOX_DIR, P.CLAIMED_DIR, P.JOBS_DIR):
        (tmp_path / d).mkdir()
    text = json.dumps(spec_doc(job_id="c1", attempt=2, nodes=0))
    (tmp_path / P.INBOX_DIR / "c1.json").write_text(text)
    agent = serve.Agent(lay, argparse.Namespace(idle_exit_s=60, poll_s=0.1, cpu_slots=1, train_device="cpu"))
    agent.slots = {"ids": [0], "kind": "cpu"}  # as serve() detects them
    assert agent.claim_and_launch() == 0
    ended = json.loads(Path(lay.attempt("c1", 2, P.EXIT_FILE)).read_text())
    assert (ended["wrapper_code"], ended["phase"]) == (P.EXIT_SETUP, "setup")
    assert ended["message"] == "malformed job spec: nodes must be an integer >= 1 <= 64, not 0"
    assert (tmp_path / P.CLAIMED_DIR / "c1.json").read_text() == text
    assert json.loads(Path(lay.job("c1", P.SPEC_FILE)).read_text()) == json.loads(text)
    assert not Path(lay.attempt("c1", 2, P.LAUNCH_FILE)).exists()  # never launched


def test_a_restarted_loop_fails_a_claimed_file_that_does_not_parse_and_launches_the_sound_one(tmp_path: Path) -> None:
    """Claims an earlier agent left unlaunched, found at start-up: the one that does not parse is failed
    in phase setup with its field named (its attempt read off the document) and never launched; the
    sound one beside it launches."""
    lay = files.Layout(str(tmp_path))
    for d in (P.INBOX_DIR, P.CLAIMED_DIR, P.JOBS_DIR):
        (tmp_path / d).mkdir()
    bad = json.dumps(spec_doc(job_id="c1", attempt=2, gpus="1"))
    (tmp_path / P.CLAIMED_DIR / "c1.json").write_text(bad)
    (tmp_path / P.CLAIMED_DIR / "c2.json").write_text(json.dumps(spec_doc(job_id="c2")))
    agent = serve.Agent(lay, argparse.Namespace(idle_exit_s=60, poll_s=0.1, cpu_slots=1, train_device="cpu"))
    agent.slots = {"ids": [0], "kind": "cpu"}  # as serve() detects them
    launched: list[tuple[str, int, tuple[int, ...]]] = []
    agent.launch = lambda job_id, spec, slots: launched.append((job_id, spec.attempt, tuple(slots)))
    agent.recover()
    assert agent.pending == ["c1", "c2"]
    assert agent.claim_and_launch() == 0
    ended = json.loads(Path(lay.attempt("c1", 2, P.EXIT_FILE)).read_text())
    assert (ended["wrapper_code"], ended["phase"]) == (P.EXIT_SETUP, "setup")
    assert ended["message"] == "malformed job spec: gpus must be an integer >= 0 <= 4096, not '1'"
    assert json.loads(Path(lay.job("c1", P.SPEC_FILE)).read_text()) == json.loads(bad)
    assert launched == [("c2", 1, (0,))] and agent.pending == []
