"""The agent's Slurm mode in process (payload/agent/gpuq_slurmmode/): the sbatch line, which status an
attempt gets from Slurm's word, the requeued run's stale record, the node's view of its GPUs.

tests/integration/test_slurm_backend.py drives the same code on a real slurmctld/slurmd cluster;
these pin each rule, including the ones a real cluster rarely shows (squeue failing, a job Slurm
forgot, a node failure without --requeue).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

slurm = load_agent_module("gpuq_slurmmode.gpuq_slurm")
submit = load_agent_module("gpuq_slurmmode.gpuq_slurm_submit")
view = load_agent_module("gpuq_slurmmode.gpuq_slurm_view")
node = load_agent_module("gpuq_slurmmode.gpuq_slurm_node")
files = load_agent_module("gpuq_base.gpuq_files")
P = load_agent_module("gpuq_base.gpuq_protocol")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")

JOB = "c000000000001"


def _spec(**kw: Any) -> Any:
    fields = {"job_id": JOB, "attempt": 1, "name": "lr/3", "queue_id": "q1", "gpus": 2, "kill_grace_s": 30,
              "python": ""}
    fields.update(kw)
    return jobspec.parse_spec(spec_doc(**fields))


def _attempt(root: Path, n: int = 1, *, slurm_id: str | None = "41", exit_doc: dict[str, Any] | None = None) -> Path:
    adir = root / P.JOBS_DIR / JOB / P.ATTEMPTS_DIR / str(n)
    adir.mkdir(parents=True, exist_ok=True)
    (adir / P.LAUNCH_FILE).write_text(json.dumps({"slurm": True, "kind": "slurm"}))
    if slurm_id is not None:
        (adir / "slurm.json").write_text(json.dumps({"job_id": slurm_id}))
    if exit_doc is not None:
        (adir / P.EXIT_FILE).write_text(json.dumps(exit_doc))
    return adir


def _entry(state: str = "dead", exit_doc: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    e = {"job_id": JOB, "attempt": 1, "state": state, "exit": exit_doc, "heartbeat": None, "heartbeat_age_s": None,
         "group_alive": False}
    e.update(kw)
    return e


def _view(monkeypatch: pytest.MonkeyPatch, seen: dict[str, dict[str, str]] | Exception) -> None:
    def fake(lay: Any, ids: list[str], comments: Sequence[str] = ()) -> dict[str, dict[str, str]]:
        if isinstance(seen, Exception):
            raise seen
        return {k: v for k, v in seen.items() if k in ids or v.get("comment") in comments}

    monkeypatch.setattr(slurm, "slurm_states", fake)


def test_the_sbatch_line_names_the_job_routes_its_log_and_asks_for_its_gpus(tmp_path: Path) -> None:
    lay = files.Layout(str(tmp_path))
    conf = {"partition": "gpu", "account": "lab", "qos": "low", "time_limit": "2:00:00",
            "sbatch_args": ["--constraint=a100"], "gres": True}
    argv = submit.sbatch_argv(lay, _spec(), conf, dependency="40")
    adir = str(tmp_path / P.JOBS_DIR / JOB / P.ATTEMPTS_DIR / "1")
    assert argv[:2] == ["sbatch", "--parsable"]
    assert argv[argv.index("--job-name") + 1] == "gpuq-q1-lr_3"  # a name Slurm's tools print cleanly
    assert argv[argv.index("--output") + 1] == adir + "/" + P.JOB_LOG
    assert argv[argv.index("--comment") + 1] == f"gpuq {JOB} a1"
    assert "--requeue" in argv and "--open-mode=append" in argv and "--gres=gpu:2" in argv
    assert "--signal=B:USR1@60" in argv  # kill_grace_s 30 + 30, at least 60
    assert argv[argv.index("--partition") + 1] == "gpu" and argv[argv.index("--account") + 1] == "lab"
    assert argv[argv.index("--qos") + 1] == "low" and argv[argv.index("--time") + 1] == "2:00:00"
    assert "--dependency=afterany:40" in argv and "--constraint=a100" in argv
    assert argv[-1] == adir + "/sbatch.sh"
    bare = submit.sbatch_argv(lay, _spec(gpus=1, kill_grace_s=120), {"gres": False, "signal_grace_s": 0})
    assert not any(a.startswith("--gres") for a in bare) and "--signal=B:USR1@150" in bare
    assert not any(a.startswith(("--partition", "--account", "--qos", "--time", "--dependency")) for a in bare)


def test_the_batch_script_execs_the_wrapper_of_this_attempt_with_every_word_quoted(tmp_path: Path) -> None:
    lay = files.Layout(str(tmp_path / "my root"))
    text = submit.batch_script(lay, _spec(python="/opt/py 3/bin/python"), {}, "/b/agent.py")
    last = text.strip().splitlines()[-1]
    assert last == f"exec '/opt/py 3/bin/python' /b/agent.py --root '{tmp_path}/my root' wrap {JOB} 1"
    assert text.startswith("#!/bin/sh\n")


def test_a_new_attempt_waits_for_an_earlier_one_slurm_may_still_run(tmp_path: Path) -> None:
    lay = files.Layout(str(tmp_path))
    assert submit.previous_alive(lay, JOB, 1) == ""
    _attempt(tmp_path, 1, slurm_id="41")
    assert submit.previous_alive(lay, JOB, 2) == "41"
    _attempt(tmp_path, 1, slurm_id="41", exit_doc={"wrapper_code": 1})
    assert submit.previous_alive(lay, JOB, 2) == ""  # it ended with a record: nothing to wait for


def test_a_job_slurm_runs_or_queues_is_running_or_claimed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = files.Layout(str(tmp_path))
    _attempt(tmp_path)
    _view(monkeypatch, {"41": {"state": "PENDING", "reason": "Resources", "nodes": ""}})
    jobs = [_entry()]
    section = view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["state"] == "claimed" and jobs[0]["exit"] is None
    assert jobs[0]["slurm"] == {"id": "41", "state": "PENDING", "reason": "Resources", "nodes": ""}
    assert section == {"jobs": 1, "error": ""}
    _view(monkeypatch, {"41": {"state": "RUNNING", "reason": "None", "nodes": "n1"}})
    jobs = [_entry()]
    view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["state"] == "running" and jobs[0]["slurm"]["nodes"] == "n1"


def test_a_job_that_ended_in_slurm_without_a_record_is_an_exit_naming_slurms_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = files.Layout(str(tmp_path))
    _attempt(tmp_path)
    _view(monkeypatch, {"41": {"state": "NODE_FAIL", "reason": "NodeDown", "nodes": "n1"}})
    jobs = [_entry()]
    section = view.apply_view(lay, jobs, 0.0)
    ex = jobs[0]["exit"]
    assert jobs[0]["state"] == "exited" and ex["vanished"] is True and ex["slurm_state"] == "NODE_FAIL"
    assert ex["wrapper_code"] == 137 and ex["message"] == (
        "Slurm job 41 ended NODE_FAIL (NodeDown) before the wrapper wrote exit.json")
    assert section["jobs"] == 0
    _view(monkeypatch, {})  # purged from Slurm's memory
    jobs = [_entry()]
    view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["exit"]["slurm_state"] == "GONE" and "no longer listed by squeue" in jobs[0]["exit"]["message"]


def test_a_record_of_a_run_slurm_requeued_is_held_back_while_slurm_still_has_the_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = files.Layout(str(tmp_path))
    stopped = {"wrapper_code": 143, "wrapper_signal": 15}
    _attempt(tmp_path, exit_doc=stopped)
    _view(monkeypatch, {"41": {"state": "PENDING", "reason": "BeginTime", "nodes": ""}})
    jobs = [_entry("exited", stopped)]
    view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["state"] == "claimed" and jobs[0]["exit"] is None  # the attempt goes on: no second copy
    _view(monkeypatch, {"41": {"state": "CANCELLED", "reason": "None", "nodes": "n1"}})
    jobs = [_entry("exited", stopped)]
    view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["state"] == "exited" and jobs[0]["exit"] == stopped
    done = {"wrapper_code": 0, "wrapper_signal": None}
    _view(monkeypatch, {"41": {"state": "COMPLETING", "reason": "None", "nodes": "n1"}})
    jobs = [_entry("exited", done)]
    view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["state"] == "exited" and jobs[0]["exit"] == done  # a verdict of its own stands


def test_when_squeue_cannot_answer_nothing_is_concluded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lay = files.Layout(str(tmp_path))
    _attempt(tmp_path)
    _view(monkeypatch, OSError("squeue exited 1: slurm_load_jobs error: Unable to contact slurm controller"))
    jobs = [_entry("dead", heartbeat={"step": 3}), ]
    section = view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["state"] == "running" and jobs[0]["exit"] is None
    assert jobs[0]["slurm"]["state"] == "UNKNOWN" and "Unable to contact" in section["error"]


def test_an_attempt_whose_sbatch_never_answered_is_dead_after_the_grace(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    lay = files.Layout(str(tmp_path))
    adir = _attempt(tmp_path, slurm_id=None)
    _view(monkeypatch, {})
    launched = (adir / P.LAUNCH_FILE).stat().st_mtime
    jobs = [_entry()]
    view.apply_view(lay, jobs, launched + 5)
    assert jobs[0]["state"] == "claimed" and jobs[0]["slurm"]["state"] == "SUBMITTING"
    jobs = [_entry()]
    view.apply_view(lay, jobs, launched + slurm.UNSUBMITTED_GRACE_S + 1)
    assert jobs[0]["state"] == "dead"


def test_an_attempt_whose_sbatch_reply_was_lost_is_found_by_its_comment(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch submitted the job but its reply (the id) never came back: squeue's comment column finds
    the attempt's Slurm job, so the attempt is never reported dead and resumed as a second copy."""
    lay = files.Layout(str(tmp_path))
    adir = _attempt(tmp_path, slurm_id=None)
    launched = (adir / P.LAUNCH_FILE).stat().st_mtime
    other = {"state": "RUNNING", "reason": "None", "nodes": "n9", "comment": f"gpuq {JOB} a2"}  # another attempt
    _view(monkeypatch, {"77": {"state": "RUNNING", "reason": "None", "nodes": "n1", "comment": f"gpuq {JOB} a1"},
                        "78": other})
    jobs = [_entry()]
    view.apply_view(lay, jobs, launched + slurm.UNSUBMITTED_GRACE_S + 1)
    assert jobs[0]["state"] == "running" and jobs[0]["slurm"]["id"] == "77", jobs[0]
    _view(monkeypatch, {"77": {"state": "PENDING", "reason": "Priority", "nodes": "", "comment": f"gpuq {JOB} a1"}})
    jobs = [_entry()]
    view.apply_view(lay, jobs, launched + slurm.UNSUBMITTED_GRACE_S + 1)
    assert jobs[0]["state"] == "claimed" and jobs[0]["slurm"]["reason"] == "Priority"
    _view(monkeypatch, OSError("squeue exited 1"))  # Slurm silent: an orphan may run, nothing is concluded
    jobs = [_entry()]
    view.apply_view(lay, jobs, launched + slurm.UNSUBMITTED_GRACE_S + 1)
    assert jobs[0]["state"] == "claimed"


def test_squeue_rows_are_kept_by_id_or_by_comment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import subprocess

    out = (f"41|RUNNING|None|n1|gpuq {JOB} a1\n42|PENDING|Priority||not | ours\n"
           f"43|PENDING|Resources||gpuq {JOB} a2\nx|RUNNING|None|n1|gpuq {JOB} a3\n41\n")

    def fake_run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[bytes]:
        assert argv[-1] == "--format=%i|%T|%r|%N|%k"
        return subprocess.CompletedProcess(argv, 0, out.encode(), b"")

    monkeypatch.setattr(slurm.subprocess, "run", fake_run)
    lay = files.Layout(str(tmp_path))
    seen = slurm.slurm_states(lay, ["41", "42"], [f"gpuq {JOB} a2", f"gpuq {JOB} a3"])
    assert seen == {"41": {"state": "RUNNING", "reason": "None", "nodes": "n1", "comment": f"gpuq {JOB} a1"},
                    "42": {"state": "PENDING", "reason": "Priority", "nodes": "", "comment": "not | ours"},
                    "43": {"state": "PENDING", "reason": "Resources", "nodes": "", "comment": f"gpuq {JOB} a2"}}
    assert slurm.slurm_states(lay, [], []) == {}


def test_a_requeued_run_sets_the_stopped_runs_record_aside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    adir = _attempt(tmp_path, exit_doc={"wrapper_code": 143})
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    moved = node.set_aside_stale_exit(str(adir))
    assert moved.endswith("exit.slurm-1.json") and not (adir / P.EXIT_FILE).exists()
    assert json.loads(Path(moved).read_text()) == {"wrapper_code": 143}
    assert node.set_aside_stale_exit(str(adir)) == ""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "junk")
    assert slurm.restart_count() == 0


def test_on_the_node_the_gpus_are_the_ones_slurm_gave(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "16")
    out = node.launch_on_node({"slurm": True, "kind": "slurm", "device": "cuda", "slots": []})
    assert out["kind"] == "gpu" and out["slots"] == [2, 3] and out["device"] == "cuda" and out["total_slots"] == 2
    assert 0 < out["master_port"] < 65536
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    out = node.launch_on_node({"slurm": True, "kind": "slurm", "device": "cuda", "total_slots": 1})
    assert out["kind"] == "cpu" and out["slots"] == [] and out["device"] == "cpu" and out["total_slots"] == 16


def test_no_agent_serves_a_slurm_root(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A serving agent on a login node would hold the root's lock (blocking every enqueue) and could
    start jobs on the login node itself: `serve` refuses a Slurm root."""
    import argparse

    serve = load_agent_module("gpuq_serving.gpuq_serve")
    (tmp_path / slurm.CONFIG_FILE).write_text(json.dumps({"max_jobs": 3}))
    args = argparse.Namespace(detach=False, idle_exit_s=0.1, poll_s=0.01, cpu_slots=1, train_device="auto")
    assert serve.cmd_serve(files.Layout(str(tmp_path)), args) == 0
    assert "no agent serves it" in capsys.readouterr().out
    assert not (tmp_path / P.AGENT_PID).exists() and not (tmp_path / P.INBOX_DIR).exists()


def test_a_multi_node_job_asks_slurm_for_its_nodes_and_starts_one_wrapper_per_node(tmp_path: Path) -> None:
    lay = files.Layout(str(tmp_path))
    argv = submit.sbatch_argv(lay, _spec(nodes=3, gpus=4), {"gres": True})
    assert "--nodes=3" in argv and "--ntasks-per-node=1" in argv and "--gres=gpu:4" in argv
    assert "--ntasks=1" not in argv and "--nodes=1" not in argv
    script = submit.batch_script(lay, _spec(nodes=3, gpus=4), {"gres": True}, "/b/agent.py").strip().splitlines()[-1]
    assert script.startswith("exec srun --nodes=3 --ntasks=3 --ntasks-per-node=1 --kill-on-bad-exit=1 --gres=gpu:4 ")
    assert script.endswith(f"wrap {JOB} 1")
    single = submit.batch_script(lay, _spec(nodes=1), {}, "/b/agent.py").strip().splitlines()[-1]
    assert "srun" not in single
    assert slurm.job_nodes(_spec(nodes=2)) == 2
    with pytest.raises(jobspec.SpecError, match=r"^nodes must be an integer >= 1"):
        _spec(nodes="junk")


def test_every_node_computes_the_same_rendezvous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "interface_to", lambda address: "ib0" if address == "10.0.0.5" else "")
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", "10.0.0.5")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    seen = []
    for rank in ("0", "1"):
        monkeypatch.setenv("SLURM_NODEID", rank)
        seen.append(node.rendezvous(2))
    (args0, env0), (args1, env1) = seen
    port = 20000 + (1234 * 7) % 30000
    assert args0 == ["--nnodes=2", "--node-rank=0", "--master-addr=10.0.0.5", f"--master-port={port}"]
    assert args1 == ["--nnodes=2", "--node-rank=1", "--master-addr=10.0.0.5", f"--master-port={port}"]
    assert env0 == env1 == {"MASTER_PORT": str(port), "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                            "GLOO_SOCKET_IFNAME": "ib0", "NCCL_SOCKET_IFNAME": "ib0"}
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # a requeued run never meets the old run's port
    assert node.rendezvous(2)[1]["MASTER_PORT"] == str(port + 1)


def test_torchrun_gets_the_rendezvous_instead_of_standalone() -> None:
    argv_mod = load_agent_module("gpuq_base.gpuq_argv")
    multi = argv_mod.launcher_prefix("torchrun", "py", 2, rendezvous=["--nnodes=2", "--node-rank=1"])
    assert multi == ["py", "-m", "torch.distributed.run", "--nnodes=2", "--node-rank=1", "--nproc-per-node=2"]
    single = argv_mod.launcher_prefix("torchrun", "py", 2, ["--local-addr=127.0.0.1"])
    assert single == ["py", "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
                      "--local-addr=127.0.0.1"]


def test_a_multi_node_attempt_reports_which_machine_got_which_rank(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lay = files.Layout(str(tmp_path))
    adir = _attempt(tmp_path)
    (adir / "node.json").write_text(json.dumps({"rank": 0, "host": "gpu-01"}))
    (adir / "node-1").mkdir()
    (adir / "node-1" / "node.json").write_text(json.dumps({"rank": 1, "host": "gpu-07" + "x" * 300}))
    (adir / "node-2").mkdir()
    (adir / "node-2" / "node.json").write_text("not json")
    _view(monkeypatch, {"41": {"state": "RUNNING", "reason": "None", "nodes": "gpu-[01,07]"}})
    jobs = [_entry()]
    view.apply_view(lay, jobs, 0.0)
    assert jobs[0]["nodes"] == [{"rank": 0, "host": "gpu-01"}, {"rank": 1, "host": ("gpu-07" + "x" * 300)[:128]}]
    single = tmp_path / "single"
    _attempt(single)
    jobs = [_entry()]
    view.apply_view(files.Layout(str(single)), jobs, 0.0)
    assert "nodes" not in jobs[0]


def test_sbatch_exports_a_fixed_list_never_the_login_nodes_whole_environment(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """sbatch's default --export=ALL would store every variable of the agent's environment with the job."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    argv = submit.sbatch_argv(files.Layout(str(tmp_path)), _spec(), {"gres": True,
                                                                     "sbatch_args": ["--constraint=a100"]})
    exports = [a for a in argv if a.startswith("--export")]
    assert len(exports) == 1 and argv.index(exports[0]) < argv.index("--constraint=a100")
    names = exports[0].split("=", 1)[1].split(",")
    assert "PATH" in names and "LC_TIME" in names
    assert all(k in submit.EXPORTED or k.startswith("LC_") for k in names)
    assert "AWS_SECRET_ACCESS_KEY" not in exports[0] and "=" not in ",".join(names)  # names only: no values
    assert submit.export_option({}) == "--export=PATH"
    assert submit.export_option({"HOME": "/h", "TOKEN": "t", "LC_ALL": "C"}) == "--export=HOME,LC_ALL"
