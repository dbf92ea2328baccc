"""What the host agent launches for one attempt, in process (payload/agent/gpuq_attempt/gpuq_launch.py): the
trainer's environment value for value, its argv, the run dir's links, secrets and grace periods.

tests/integration/test_agent.py and the own-project tests run the same code in real agents; these
tests pin each rule (scripts/mutation.py launch).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

launch = load_agent_module("gpuq_attempt.gpuq_launch", qualified=True)
jail = load_agent_module("gpuq_attempt.gpuq_jail")
P = load_agent_module("gpuq_base.gpuq_protocol")
files = load_agent_module("gpuq_base.gpuq_files")
hostfacts = load_agent_module("gpuq_base.gpuq_hostfacts")
jobspec = load_agent_module("gpuq_base.gpuq_jobspec")

SHA = "b" * 64
# what a spec that sets nothing optional carries (the fields every spec has, at their emptiest)
BARE = {"bundle_sha": "", "name": "", "queue_id": "", "config": "", "task": "", "epochs": None, "spec_hash": "",
        "kill_grace_s": 30, "heartbeat_s": P.DEFAULT_HEARTBEAT_S, "ckpt_interval_s": P.DEFAULT_CKPT_INTERVAL_S,
        "durable_dir": "", "seed": None, "resume_from": None, "env": {}, "min_free_gb": 0, "scratch_gb": 0, "args": []}


def _js(**kw: Any) -> Any:
    """The agent's ``JobSpec`` of a spec with every field it must have, ``kw`` set over them."""
    return jobspec.parse_spec(spec_doc(**{**BARE, **kw}))


def _run(**kw: Any) -> Any:
    return jobspec.parse_run(kw)


@pytest.mark.parametrize(("spec", "kill", "term"), [
    ({}, 30.0, "30"),
    ({"kill_grace_s": 12}, 12.0, "12"),
    ({"kill_grace_s": 0}, 0.0, "0"),
    ({"kill_grace_s": 12, "sigterm_grace_s": 5}, 12.0, "5"),
    ({"kill_grace_s": 12, "sigterm_grace_s": 50}, 12.0, "12"),  # never past the kill
    ({"kill_grace_s": 12, "sigterm_grace_s": 0}, 12.0, "0"),
    ({"kill_grace_s": 12, "sigterm_grace_s": None}, 12.0, "12"),
    ({"kill_grace_s": 7.5, "sigterm_grace_s": 2.25}, 7.5, "2.25"),
])
def test_grace_periods(spec: dict[str, Any], kill: float, term: str) -> None:
    assert launch.kill_grace(_js(**spec)) == kill
    assert launch.sigterm_grace(_js(**spec)) == term


@pytest.mark.parametrize(("bad", "why"), [
    ({"kill_grace_s": -3}, "kill_grace_s must be a number >= 0, not -3"),
    ({"kill_grace_s": None}, "kill_grace_s must be a number >= 0, not None"),
    ({"kill_grace_s": "soon"}, "kill_grace_s must be a number >= 0, not 'soon'"),
    ({"sigterm_grace_s": -1}, "sigterm_grace_s must be a number >= 0, not -1"),
    ({"sigterm_grace_s": "x"}, "sigterm_grace_s must be a number >= 0, not 'x'"),
    ({"kill_grace_s": float("nan")}, "kill_grace_s must be a number >= 0, not nan"),
])
def test_a_grace_that_is_not_a_number_refuses_the_spec(bad: dict[str, Any], why: str) -> None:
    with pytest.raises(jobspec.SpecError) as info:
        _js(**bad)
    assert str(info.value) == why


def test_reserved_names() -> None:
    run = _run(outputs=["out/**", "./figs/*.png", "*.log", "", "a\\b/c"], checkpoint=["ckpt/*.pt"])
    assert launch.reserved_names(run) == {"out", "figs", "a", "ckpt"}
    assert launch.reserved_names(_run(outputs=["[ab]/x"])) == set()
    assert launch.reserved_names(None) == set()


def test_a_glob_under_a_dot_directory_reserves_the_dot_name() -> None:
    """``.cache/**`` reserves ``.cache`` (not ``cache``, which would leave ``.cache`` linked to the
    bundle and reserve a project directory the job never writes)."""
    run = _run(outputs=[".cache/**", "./.hidden/x", ".//.git/y", "./../up/z"], checkpoint=["./ckpt/*.pt"])
    assert launch.reserved_names(run) == {".cache", ".hidden", ".git", "ckpt"}
    assert launch.reserved_names(_run(outputs=[".", "./", ".."])) == set()


def test_the_newest_real_checkpoint_file_wins(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "ckpt" / "sub").mkdir(parents=True)
    old, new, deep = run_dir / "ckpt" / "a.pt", run_dir / "ckpt" / "b.pt", run_dir / "ckpt" / "sub" / "c.pt"
    for i, path in enumerate((old, new, deep)):
        path.write_text("x")
        os.utime(path, (1000 + i, 1000 + i))
    (run_dir / "ckpt" / "z.pt").symlink_to(old)  # a link is never the checkpoint
    os.utime(run_dir / "ckpt" / "z.pt", (5000, 5000), follow_symlinks=False)
    (run_dir / "ckpt" / "dir.pt").mkdir()
    assert launch.newest_checkpoint(str(run_dir), _run(checkpoint=["ckpt/*.pt"])) == str(new)
    assert launch.newest_checkpoint(str(run_dir), _run(checkpoint=["nothing/*", "ckpt/**/*.pt"])) == str(deep)
    assert launch.newest_checkpoint(str(run_dir), _run(checkpoint=[])) is None
    assert launch.newest_checkpoint(str(run_dir), None) is None


def test_the_project_is_linked_into_the_run_dir(tmp_path: Path) -> None:
    work, run_dir = tmp_path / "work", tmp_path / "run"
    for name in ("src", "data", "out", "configs"):
        (work / name).mkdir(parents=True)
    (work / "train.py").write_text("")
    run_dir.mkdir()
    (run_dir / "data").mkdir()  # the job's own dir: never replaced
    (run_dir / "configs").symlink_to(tmp_path / "old-bundle")  # a stale link of another bundle
    launch.link_project(str(work), str(run_dir), _run(outputs=["out/*"]))
    links = {p.name: os.readlink(p) for p in run_dir.iterdir() if p.is_symlink()}
    assert links == {"src": str(work / "src"), "train.py": str(work / "train.py"), "configs": str(work / "configs")}
    assert (run_dir / "data").is_dir() and not (run_dir / "data").is_symlink()
    assert not (run_dir / "out").exists()  # an outputs dir is the job's own
    launch.link_project(str(work), str(run_dir), _run(outputs=["out/*"]))  # again: nothing changes
    assert {p.name: os.readlink(p) for p in run_dir.iterdir() if p.is_symlink()} == links
    launch.link_project(str(tmp_path / "missing"), str(tmp_path / "run2"), None)
    assert list((tmp_path / "run2").iterdir()) == []


def test_two_wrappers_linking_one_run_dir_at_once_both_succeed(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes of a multi-node job share its run dir: the other node's wrapper may create a link
    between this one's look and its symlink call."""
    work, run_dir = tmp_path / "work", tmp_path / "run"
    for name in ("src", "configs"):
        (work / name).mkdir(parents=True)
    real = os.symlink

    def racing(target: str, link: str) -> None:
        real(target, link)  # the other node was first
        raise FileExistsError(17, "File exists", link)

    monkeypatch.setattr(launch.os, "symlink", racing)
    launch.link_project(str(work), str(run_dir), None)
    assert {p.name: os.readlink(p) for p in run_dir.iterdir()} == {"src": str(work / "src"),
                                                                   "configs": str(work / "configs")}


def _env(tmp_path: Path, spec: dict[str, Any], launch_doc: dict[str, Any]) -> dict[str, str]:
    return launch.build_env(files.Layout(str(tmp_path)), "c1", 2, _js(**spec), launch_doc)


def test_the_trainers_environment_value_for_value(tmp_path: Path) -> None:
    spec = {"bundle_sha": SHA, "name": "base", "queue_id": "q1", "config": "configs/a.yaml", "task": "classify",
            "epochs": 3, "heartbeat_s": 5, "ckpt_interval_s": 60, "durable_dir": "/d", "spec_hash": "h",
            "kill_grace_s": 45, "sigterm_grace_s": 5, "seed": 7, "resume_from": '{"step": 8}',
            "env": {"PYTHONPATH": "/extra", "OMP_NUM_THREADS": "3", "GPUQ_SEED": "99", "MY": "1"}}
    env = _env(tmp_path, spec, {"kind": "gpu", "slots": [2, 3], "total_slots": 4, "master_port": 29511})
    work = f"{tmp_path}/bundles/{SHA}/{P.BUNDLE_WORKDIR}"
    job, att = f"{tmp_path}/jobs/c1", f"{tmp_path}/jobs/c1/attempts/2"
    threads = str(hostfacts.thread_cap(4))
    assert env == {
        "MY": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": f"{work}:/extra",
        "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": threads,
        "HF_HOME": f"{tmp_path}/{P.CACHE_DIR}/huggingface", "PIP_CACHE_DIR": f"{tmp_path}/{P.CACHE_DIR}/pip",
        "GPUQ_JOB_ID": "c1", "GPUQ_JOB_NAME": "base", "GPUQ_QUEUE_ID": "q1", "GPUQ_ATTEMPT": "2",
        "GPUQ_CONFIG": f"{work}/configs/a.yaml", "GPUQ_TASK": "classify", "GPUQ_EPOCHS": "3",
        "GPUQ_CKPT_DIR": f"{job}/ckpt", "GPUQ_RESULT_DIR": f"{job}/result", "GPUQ_RUN_DIR": f"{job}/run",
        "GPUQ_LOG": f"{att}/{P.JOB_LOG}", "GPUQ_HEARTBEAT": f"{att}/{P.HEARTBEAT_FILE}", "GPUQ_HEARTBEAT_S": "5",
        "GPUQ_RESUME_FROM": '{"step": 8}', "GPUQ_CKPT_INTERVAL_S": "60", "GPUQ_DURABLE_DIR": "/d",
        "GPUQ_SPEC_HASH": "h", "GPUQ_BUNDLE_SHA": SHA, "GPUQ_DEVICE": "cuda",
        "GPUQ_EXIT_FILE": f"{att}/{P.TRAINER_EXIT_FILE}", "GPUQ_SIGTERM_GRACE_S": "5", "MASTER_PORT": "29511",
        "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "45", "GPUQ_SEED": "7", "CUDA_VISIBLE_DEVICES": "2,3",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "TTY_COMPATIBLE": "1",
    }


def test_a_cpu_environment_and_the_defaults(tmp_path: Path) -> None:
    env = _env(tmp_path, {"env": {"CUDA_DEVICE_ORDER": "x", "GPUQ_SEED": "3"}}, {"slots": [0, 1, 2]})
    assert (env["CUDA_VISIBLE_DEVICES"], env["GPUQ_DEVICE"]) == ("", "cpu")
    assert "CUDA_DEVICE_ORDER" not in env and "GPUQ_SEED" not in env and "MASTER_PORT" not in env
    threads = str(hostfacts.thread_cap(3))
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == (threads, threads)
    assert env["PYTHONPATH"] == f"{tmp_path}/bundles/{P.BUNDLE_WORKDIR}"
    assert (env["GPUQ_HEARTBEAT_S"], env["GPUQ_CKPT_INTERVAL_S"]) == (str(P.DEFAULT_HEARTBEAT_S),
                                                                      str(P.DEFAULT_CKPT_INTERVAL_S))
    assert (env["GPUQ_RESUME_FROM"], env["GPUQ_DURABLE_DIR"], env["GPUQ_SIGTERM_GRACE_S"]) == ("", "", "30")
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "30"  # never below torchrun's own 30 s
    assert _env(tmp_path, {"resume_from": "/ck/latest.pt"}, {"device": "mps"})["GPUQ_RESUME_FROM"] == "/ck/latest.pt"
    assert _env(tmp_path, {}, {"device": "mps"})["GPUQ_DEVICE"] == "mps"
    assert _env(tmp_path, {"kill_grace_s": 90.2}, {})["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "91"
    assert _env(tmp_path, {"env": {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}}, {})["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "5"
    assert _env(tmp_path, {}, {"total_slots": 0})["OMP_NUM_THREADS"] == str(hostfacts.thread_cap(1))


def test_only_the_named_secrets_of_the_jobs_own_sweep(tmp_path: Path) -> None:
    lay = files.Layout(str(tmp_path))
    (tmp_path / P.SECRETS_DIR).mkdir()
    (tmp_path / P.SECRETS_DIR / "q1.json").write_text(json.dumps({"HF_TOKEN": "hf", "OTHER": "o", "N": 3}))
    spec = {"queue_id": "q1", "run": {"forward_env": ["HF_TOKEN", "N", "MISSING"]}}
    assert launch.secrets_for(lay, _js(**spec)) == {"HF_TOKEN": "hf", "N": "3"}
    assert launch.secrets_for(lay, _js(queue_id="q1", run={})) == {}
    assert launch.secrets_for(lay, _js(**dict(spec, queue_id=""))) == {}
    assert launch.secrets_for(lay, _js(**dict(spec, queue_id="../q1"))) == {}
    assert launch.secrets_for(lay, _js(**dict(spec, queue_id=".q1"))) == {}
    assert launch.secrets_for(lay, _js(**dict(spec, queue_id="q2"))) == {}
    (tmp_path / P.SECRETS_DIR / "q3.json").write_text("[1]")
    assert launch.secrets_for(lay, _js(**dict(spec, queue_id="q3"))) == {}


def _argv(tmp_path: Path, spec: dict[str, Any], nproc: int = 2) -> list[str]:
    lay = files.Layout(str(tmp_path))
    parsed = _js(**spec)
    env = launch.build_env(lay, "c1", 1, parsed, {"master_port": 29600})
    return launch.job_argv(lay, "c1", 1, parsed, env, "/py", nproc)


def test_the_payloads_argv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch, "local_addr_args", lambda: ["--local-addr=127.0.0.1"])
    spec = {"bundle_sha": SHA, "config": "c.yaml", "task": "classify", "epochs": 3, "entry": "", "launcher": ""}
    argv = _argv(tmp_path, spec)
    work = f"{tmp_path}/bundles/{SHA}/{P.BUNDLE_WORKDIR}"
    assert argv[:7] == ["/py", "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
                        "--local-addr=127.0.0.1"]
    assert argv[-7:] == [f"{tmp_path}/bundles/{SHA}/{P.TRAIN_ENTRY}", "--config", f"{work}/c.yaml", "--task",
                         "classify", "--epochs", "3"]
    python = _argv(tmp_path, dict(spec, launcher="python", entry="x/{odd}.py"))
    assert python == ["/py", f"{tmp_path}/bundles/{SHA}/x/{{odd}}.py", "--config", f"{work}/c.yaml", "--task",
                      "classify", "--epochs", "3"]


def test_a_projects_argv_resumes_only_from_a_checkpoint_that_exists(tmp_path: Path) -> None:
    run = {"launcher": "python", "command": ["train.py", "--out", "{run_dir}", "--seed", "{seed}", "--port",
                                             "{master_port}", "--j", "{job_id}/{attempt}/{name}"],
           "resume_args": ["--resume", "{checkpoint}"], "checkpoint": ["ck/*.pt"]}
    spec = {"bundle_sha": SHA, "name": "n1", "seed": 4, "args": ["--lr", "0.1"], "run": run}
    run_dir = f"{tmp_path}/jobs/c1/run"
    fresh = _argv(tmp_path, spec)
    assert fresh == ["/py", "train.py", "--out", run_dir, "--seed", "4", "--port", "29600", "--j", "c1/1/n1",
                     "--lr", "0.1"]
    Path(run_dir, "ck").mkdir(parents=True)
    Path(run_dir, "ck", "e1.pt").write_text("x")
    resumed = _argv(tmp_path, spec)
    assert resumed == [*fresh, "--resume", f"{run_dir}/ck/e1.pt"]
    assert _argv(tmp_path, dict(spec, seed=None))[5] == ""


def test_torchrun_pins_its_address_only_when_the_hostname_does_not_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [])
    assert launch.local_addr_args() == []

    def fail(*a: Any, **k: Any) -> Any:
        raise OSError("no such host")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    assert launch.local_addr_args() == ["--local-addr=127.0.0.1"]


def test_the_read_only_bundle_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert jail.read_only_prefix(str(tmp_path)) == ([], "")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(jail.shutil, "which", lambda name: None)
    assert jail.read_only_prefix(str(tmp_path)) == ([], "unshare/mount not found")
    monkeypatch.setattr(jail.shutil, "which", lambda name: f"/bin/{name}")
    codes: list[int] = []

    def run(argv: list[str], **_: Any) -> Any:
        return subprocess.CompletedProcess(argv, codes.pop(0))

    monkeypatch.setattr(jail.subprocess, "run", run)
    codes[:] = [3, 3]
    assert jail.read_only_prefix(str(tmp_path)) == ([], "unshare --mount exited 3")
    (tmp_path / "secrets").mkdir()
    start = ["/bin/unshare", "-m", "--propagation", "private", "--", sys.executable, "-I", "-S", "-c", jail.JAIL,
             "/bin/mount"]
    ro = [str(tmp_path.parent), *jail.interpreter_dirs([str(tmp_path.parent), "/tmp", str(tmp_path)])]
    hidden = [str(tmp_path / "secrets"), str(tmp_path / "not-yet")]
    codes[:] = [0]
    prefix, why = jail.read_only_prefix(str(tmp_path), root=str(tmp_path), hidden=hidden)
    assert why == "" and prefix == [*start, json.dumps(ro), json.dumps(hidden), "{}"]
    # a dir to hide is made now: one another sweep's enqueue made later would not be covered
    assert (tmp_path / "not-yet").stat().st_mode & 0o777 == 0o700
    codes[:] = [1, 0]  # the interpreter's dirs cannot be made read-only: the bundles still are
    prefix, why = jail.read_only_prefix(str(tmp_path), root=str(tmp_path), hidden=hidden)
    assert prefix == [*start, json.dumps(ro[:1]), json.dumps(hidden), "{}"]
    assert why == "the interpreter's directories stay writable (unshare --mount exited 1)"

    def broken(*a: Any, **k: Any) -> Any:
        raise OSError("denied")

    monkeypatch.setattr(jail.subprocess, "run", broken)
    assert jail.read_only_prefix(str(tmp_path)) == ([], "unshare failed: denied")


def test_the_interpreters_dirs_leave_out_the_root_and_what_holds_the_agents_files(tmp_path: Path) -> None:
    dirs = jail.interpreter_dirs([str(tmp_path)])
    assert sysconfig.get_paths()["purelib"].startswith(tuple(dirs)), dirs
    assert "/" not in dirs and all(os.path.isabs(d) for d in dirs)
    holding_prefix = jail.interpreter_dirs([os.path.join(os.path.realpath(sys.prefix), "agent-root")])
    assert os.path.realpath(sys.prefix) not in holding_prefix  # its site-packages are still read-only
    assert sysconfig.get_paths()["purelib"].startswith(tuple(holding_prefix)), holding_prefix


ESCAPES = r"""
import json, os, subprocess, sys
bundles, outside = sys.argv[1], sys.argv[2]
seen = {}
def attempt(name, path):
    try:
        with open(path, "a") as fh:
            fh.write("tampered")
        seen[name] = 0
    except OSError as e:
        seen[name] = e.errno
attempt("other_bundle", os.path.join(bundles, "other", "train.py"))
attempt("own_bundle", os.path.join(bundles, "own", "train.py"))
attempt("via_agent_root", "/proc/%s/root%s" % (outside, os.path.join(bundles, "other", "train.py")))
quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
seen["remount"] = subprocess.call(["mount", "-o", "remount,bind,rw", bundles], **quiet)
seen["umount"] = subprocess.call(["umount", "-l", bundles], **quiet)
seen["userns_remount"] = subprocess.call(["unshare", "-U", "-r", "-m", "mount", "-o", "remount,bind,rw", bundles],
                                         **quiet)
attempt("after_all", os.path.join(bundles, "other", "train.py"))
seen["cap_bnd"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapBnd")][0]
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_root_trainer_cannot_write_any_bundle_nor_remount_them(tmp_path: Path) -> None:
    """All of bundles/ is read-only to a job run as root, and stays so: no remount, no umount, no user
    namespace, no detour through /proc/<agent pid>/root (issue 23 item 5)."""
    bundles = tmp_path / "bundles"
    for name in ("own", "other"):
        (bundles / name).mkdir(parents=True)
        (bundles / name / "train.py").write_text("print('honest')\n")
    prefix, why = jail.read_only_prefix(str(bundles / "own"))
    assert why == "" and prefix
    out = subprocess.run([*prefix, sys.executable, "-c", ESCAPES, str(bundles), str(os.getpid())],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    for name in ("other_bundle", "own_bundle", "after_all"):
        assert seen[name] == errno.EROFS, (name, seen)
    assert seen["via_agent_root"] in (errno.EACCES, errno.EPERM), seen
    assert seen["remount"] != 0 and seen["umount"] != 0 and seen["userns_remount"] != 0, seen
    assert not int(seen["cap_bnd"], 16) & (1 << jail.CAPS_DROPPED["CAP_SYS_ADMIN"]), seen
    for name in ("own", "other"):
        assert (bundles / name / "train.py").read_text() == "print('honest')\n"
    (bundles / "other" / "new.txt").write_text("the agent still writes here")  # outside the job's namespace


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_jobs_loader_variables_reach_only_the_trainer_not_the_root_steps_before_it(tmp_path: Path) -> None:
    """LD_PRELOAD from a project's [run] env would load its code into unshare, mount and the jail as
    root with every capability; the jail starts without it and sets it for the trainer's exec only."""
    (tmp_path / "bundles" / "own").mkdir(parents=True)
    env = dict(os.environ, LD_PRELOAD="/nonexistent/gpuq-preload.so", KEEP="1")
    clean, loader = jail.split_loader_env(env)
    assert loader == {"LD_PRELOAD": "/nonexistent/gpuq-preload.so"} and clean["KEEP"] == "1"
    assert "LD_PRELOAD" not in clean
    prefix, why = jail.read_only_prefix(str(tmp_path / "bundles" / "own"), loader)
    assert why == ""
    show = "import os; print(os.environ.get('LD_PRELOAD'), os.environ.get('KEEP'))"
    out = subprocess.run([*prefix, sys.executable, "-c", show], env=clean, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["/nonexistent/gpuq-preload.so", "1"], out
    # the loader complains once per dynamically linked exec that sees the variable: the trainer only
    assert out.stderr.count("gpuq-preload.so") == 1, out.stderr


PLANT = r"""
import json, os, sys, sysconfig
secrets, pth = sys.argv[1], sys.argv[2]
seen = {"listed": sorted(os.listdir(secrets)), "token": os.environ.get("OWN_TOKEN")}
try:
    with open(pth, "w") as fh:
        fh.write("# harmless: gpuq's jail test\n")
    seen["pth"] = 0
except OSError as e:
    seen["pth"] = e.errno
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare")
def test_a_root_trainer_neither_reads_other_sweeps_secrets_nor_plants_a_pth(tmp_path: Path) -> None:
    """Issue 43 items 3 and 4: secrets/ is an empty tmpfs in the job's namespace (its own values come in
    its environment), and the interpreter's site-packages are read-only, so no .pth runs in the agent,
    the next jail or another job."""
    (tmp_path / "bundles" / "own").mkdir(parents=True)
    secrets = tmp_path / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "other-sweep.json").write_text('{"OTHER_TOKEN": "theirs-1234"}')
    pth = Path(sysconfig.get_paths()["purelib"]) / f"gpuq-jail-test-{os.getpid()}.pth"
    prefix, why = jail.read_only_prefix(str(tmp_path / "bundles" / "own"), root=str(tmp_path),
                                          hidden=[str(secrets)])
    assert why == "" and prefix
    env = dict(os.environ, OWN_TOKEN="mine-5678")
    try:
        out = subprocess.run([*prefix, sys.executable, "-c", PLANT, str(secrets), str(pth)], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        seen = json.loads(out.stdout)
        assert not pth.exists()
    finally:
        pth.unlink(missing_ok=True)
    assert seen == {"listed": [], "token": "mine-5678", "pth": errno.EROFS}, seen
    assert (secrets / "other-sweep.json").read_text() == '{"OTHER_TOKEN": "theirs-1234"}'  # the agent's own view


def test_a_spec_without_optional_fields_gives_empty_values_never_none(tmp_path: Path) -> None:
    env = _env(tmp_path, {}, {})  # every empty value a spec may carry
    for key in ("GPUQ_JOB_NAME", "GPUQ_QUEUE_ID", "GPUQ_TASK", "GPUQ_EPOCHS", "GPUQ_SPEC_HASH", "GPUQ_BUNDLE_SHA"):
        assert env[key] == "", key
    assert env["GPUQ_CONFIG"] == f"{tmp_path}/bundles/{P.BUNDLE_WORKDIR}/"
    assert _env(tmp_path, {"env": {"MKL_NUM_THREADS": "5"}}, {})["MKL_NUM_THREADS"] == "5"
    many = _env(tmp_path, {}, {"total_slots": 64, "slots": [0]})
    assert many["OMP_NUM_THREADS"] == many["MKL_NUM_THREADS"] == str(hostfacts.thread_cap(64))
    with pytest.raises(jobspec.SpecError, match=r"^resume_from must be a string"):  # never a JSON object
        _js(resume_from={"step": 8, "file": "a.pt"})
    spec = _js(bundle_sha=SHA, run={"launcher": "python", "command": ["t.py", "{name}", "{master_port}", "x"]},
               args=[])
    lay = files.Layout(str(tmp_path))
    argv = launch.job_argv(lay, "c1", 1, spec, launch.build_env(lay, "c1", 1, spec, {}), "/py", 1)
    assert argv == ["/py", "t.py", "", "", "x"]


def test_a_queue_id_with_a_slash_or_none_reads_no_secrets(tmp_path: Path) -> None:
    lay = files.Layout(str(tmp_path))
    (tmp_path / P.SECRETS_DIR / "x").mkdir(parents=True)
    for name in ("x/q1.json", ".json", "None.json", "XXXX.json"):
        (tmp_path / P.SECRETS_DIR / name).write_text(json.dumps({"HF_TOKEN": "leaked"}))
    run = {"forward_env": ["HF_TOKEN"]}
    assert launch.secrets_for(lay, _js(queue_id="x/q1", run=run)) == {}
    assert launch.secrets_for(lay, _js(queue_id="", run=run)) == {}
