"""The launch path of a job with a project command (spec "run"): run dir, argv, env, secrets, read-only
bundle, on a local root driven like tests/integration/test_agent.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_agent import Host, read_json, wait_for

pytestmark = pytest.mark.integration

TRAINER = r'''
import json, os, sys
import mylib
here = os.getcwd()
out = {"cwd": here, "argv": sys.argv[1:], "data": open("data/input.txt").read(), "lib": mylib.VALUE,
       "env": {k: v for k, v in os.environ.items()}}
project = os.environ["PYTHONPATH"].split(":")[0]
try:
    with open(os.path.join(project, "intrusion.txt"), "w") as f:
        f.write("x")
    out["bundle_write"] = "ok"
except OSError as e:
    out["bundle_write"] = e.errno
with open("mine.txt", "w") as f:
    f.write(os.environ["GPUQ_JOB_NAME"])
json.dump(out, open("seen.json", "w"))
'''


def project(host: Host) -> None:
    (host.workdir / "job.py").write_text(TRAINER)
    (host.workdir / "mylib.py").write_text("VALUE = 42\n")
    (host.workdir / "data").mkdir()
    (host.workdir / "data" / "input.txt").write_text("hello")
    subprocess.run(["chmod", "-R", "a-w", str(host.workdir)], check=True)


def run_spec(host: Host, name: str, **run: Any) -> dict[str, Any]:
    section = {"command": ["job.py", "{args}"], "launcher": "python", "resume_args": [], "checkpoint": [],
               "outputs": [], "forward_env": [], "setup": "", "setup_key": ""}
    section.update(run)
    args = run.pop("args", None) or ["--name", name]
    section.pop("args", None)
    return host.spec(name, "configs/none.json", verify=[], run=section, args=args)


@pytest.fixture
def host(tmp_path: Path):
    h = Host(tmp_path / "root", tmp_path / "runs.jsonl")
    yield h
    h.cleanup()
    subprocess.run(["chmod", "-R", "u+w", str(tmp_path)], check=False)


def seen(host: Host, job_id: str) -> dict[str, Any]:
    return read_json(host.root / "jobs" / job_id / "run" / "seen.json")


def test_run_dirs_are_isolated_and_read_the_project(host: Host) -> None:
    project(host)
    a = run_spec(host, "a", args=["--lr", "3e-4", "x y"])
    b = run_spec(host, "b")
    host.serve(slots=2, idle=30)
    for s in (a, b):
        ex = host.wait_exit(s["job_id"])
        assert ex["wrapper_code"] == 0, ex
    sa, sb = seen(host, a["job_id"]), seen(host, b["job_id"])
    run_a = host.root / "jobs" / a["job_id"] / "run"
    assert sa["cwd"] == str(run_a) and sa["env"]["GPUQ_RUN_DIR"] == str(run_a)
    assert sa["argv"] == ["--lr", "3e-4", "x y"] and sb["argv"] == ["--name", "b"]
    assert sa["data"] == "hello" and sa["lib"] == 42
    assert (run_a / "mine.txt").read_text() == "a"
    assert (host.root / "jobs" / b["job_id"] / "run" / "mine.txt").read_text() == "b"
    assert (run_a / "data").is_symlink() and not (run_a / "mine.txt").is_symlink()
    # the bundle is read-only for the trainer, even as root (EROFS in its mount namespace, else EACCES)
    assert sa["bundle_write"] in (30, 13), sa["bundle_write"]
    assert not (host.workdir / "intrusion.txt").exists()
    assert sa["env"]["PYTHONPATH"].split(":")[0] == str(host.workdir)
    assert sa["env"]["PYTHONUNBUFFERED"] == "1"


def test_master_ports_distinct_and_recorded(host: Host) -> None:
    project(host)
    a = run_spec(host, "a")
    b = run_spec(host, "b")
    host.serve(slots=2, idle=30)
    for s in (a, b):
        assert host.wait_exit(s["job_id"])["wrapper_code"] == 0
    ports = []
    for s in (a, b):
        launch = read_json(host.attempt(s["job_id"]) / "launch.json")
        assert seen(host, s["job_id"])["env"]["MASTER_PORT"] == str(launch["master_port"])
        ports.append(launch["master_port"])
    assert ports[0] != ports[1]


def test_resume_args_only_with_a_checkpoint(host: Host) -> None:
    project(host)
    first = run_spec(host, "fresh", checkpoint=["snap*.pt"], resume_args=["--resume", "{checkpoint}"])
    host.serve(slots=1, idle=30)
    assert host.wait_exit(first["job_id"])["wrapper_code"] == 0
    assert seen(host, first["job_id"])["argv"] == ["--name", "fresh"]
    run_dir = host.root / "jobs" / first["job_id"] / "run"
    (run_dir / "snap1.pt").write_text("1")
    second = dict(first, attempt=2)
    (host.root / "inbox" / (first["job_id"] + ".json")).write_text(json.dumps(second))
    ex = wait_for(lambda: host.exit_of(first["job_id"], 2), 30, "second attempt")
    assert ex["wrapper_code"] == 0, ex
    assert seen(host, first["job_id"])["argv"] == ["--name", "fresh", "--resume", str(run_dir / "snap1.pt")]


def test_forwarded_secret_reaches_only_the_trainer(host: Host) -> None:
    project(host)
    secret = "s3cr3t-" + os.urandom(6).hex()
    spec = run_spec(host, "sec", forward_env=["WANDB_API_KEY"])
    os.unlink(host.root / "inbox" / (spec["job_id"] + ".json"))
    r = subprocess.run([*host.cli_argv(), "enqueue"], input=json.dumps(
        {"specs": [spec], "secrets": {"q1": {"WANDB_API_KEY": secret}}}), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    sfile = host.root / "secrets" / "q1.json"
    assert oct(sfile.stat().st_mode & 0o777) == "0o600"
    assert oct(sfile.parent.stat().st_mode & 0o777) == "0o700"
    host.serve(slots=1, idle=30)
    assert host.wait_exit(spec["job_id"])["wrapper_code"] == 0
    assert seen(host, spec["job_id"])["env"]["WANDB_API_KEY"] == secret
    wait_for(lambda: not sfile.exists(), 20, "secrets file deleted")
    for path in host.root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.name != "seen.json":
            assert secret.encode() not in path.read_bytes(), path


KEY = "ab" * 32


def test_setup_runs_once_for_two_racing_jobs(host: Host) -> None:
    project(host)
    setup = "echo ran >> $GPUQ_TEST_COUNT; sleep 1; touch built.txt; test -w ."
    specs = [run_spec(host, n, setup=setup, setup_key=KEY) for n in ("a", "b")]
    count = host.root.parent / "count.txt"
    for s in specs:  # the count file's path reaches setup through the job's env
        s["env"] = {"GPUQ_TEST_COUNT": str(count)}
        (host.root / "inbox" / (s["job_id"] + ".json")).write_text(json.dumps(s))
    host.serve(slots=2, idle=30)
    for s in specs:
        assert host.wait_exit(s["job_id"])["wrapper_code"] == 0
    assert count.read_text() == "ran\n"
    kdir = host.root / "setup" / KEY
    ran_in = host.root / "bundles" / ".setup" / KEY / "project"  # the hook's writable copy (gpuq_setup.py)
    assert (kdir / "ok.json").exists() and (ran_in / "built.txt").exists()
    assert "job.py" in os.listdir(ran_in)


def test_failed_setup_fails_fast_with_its_message(host: Host) -> None:
    project(host)
    bad = "echo installing; echo 'ERROR: no matching distribution' >&2; exit 3"
    first = run_spec(host, "first", setup=bad, setup_key=KEY)
    host.serve(slots=1, idle=30)
    ex = host.wait_exit(first["job_id"])
    assert ex["wrapper_code"] == 80 and ex["phase"] == "setup" and ex["setup_failed"] is True
    assert ex["setup_key"] == KEY
    assert ex["message"].startswith("setup failed (exit 3) on ")
    assert ex["message"].endswith(": ERROR: no matching distribution")
    log = (host.root / "setup" / KEY / "setup.log").read_text()
    assert log.count("installing") == 1
    second = run_spec(host, "second", setup=bad, setup_key=KEY)
    ex2 = host.wait_exit(second["job_id"])
    assert ex2["wrapper_code"] == 80 and ex2["message"] == ex["message"]
    assert (host.root / "setup" / KEY / "setup.log").read_text().count("installing") == 1
    assert not (host.root / "jobs" / second["job_id"] / "run" / "seen.json").exists()


def _enqueue_with_secret(host: Host, spec: dict[str, Any], **values: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(host.root / "inbox" / (spec["job_id"] + ".json"))
    r = subprocess.run([*host.cli_argv(), "enqueue"], input=json.dumps(
        {"specs": [spec], "secrets": {"q1": values}}), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_setup_hook_that_echoes_its_token_leaves_it_in_no_document(host: Host) -> None:
    """docs/security.md: a forwarded value never reaches a document the controller reads (the exit
    record's message and setup tail, the setup's failed.json, status)."""
    project(host)
    secret = "hf_" + os.urandom(12).hex()
    leak = 'echo "logging in with $HF_TOKEN"; echo "ERROR: token $HF_TOKEN rejected" >&2; exit 3'
    first = run_spec(host, "first", setup=leak, setup_key=KEY, forward_env=["HF_TOKEN"])
    second = run_spec(host, "second", setup=leak, setup_key=KEY, forward_env=["HF_TOKEN"])
    os.unlink(host.root / "inbox" / (second["job_id"] + ".json"))
    _enqueue_with_secret(host, first, HF_TOKEN=secret)
    host.serve(slots=1, idle=30)
    ex = host.wait_exit(first["job_id"])
    assert secret in (host.root / "setup" / KEY / "setup.log").read_text()  # the hook did see and echo it
    assert ex["wrapper_code"] == 80 and ex["setup_failed"] is True
    assert ex["message"].endswith(": ERROR: token [redacted] rejected"), ex["message"]
    assert "logging in with [redacted]" in ex["setup_tail"]
    _enqueue_with_secret(host, second, HF_TOKEN=secret)  # fails fast on the recorded failure
    ex2 = host.wait_exit(second["job_id"])
    assert ex2["wrapper_code"] == 80 and ex2["message"] == ex["message"]
    documents = [host.attempt(s["job_id"]) / "exit.json" for s in (first, second)]
    documents.append(host.root / "setup" / KEY / "failed.json")
    for path in documents:
        assert secret not in path.read_text(), path
    assert secret not in json.dumps(host.status())


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_what_the_agent_creates_is_private(host: Host) -> None:
    """docs/security.md: on a shared host other users read nothing of a root (umask 077, root 0700)."""
    project(host)
    os.chmod(host.root, 0o755)
    spec = run_spec(host, "private")
    host.serve(slots=1, idle=30)
    assert host.wait_exit(spec["job_id"])["wrapper_code"] == 0
    job = host.root / "jobs" / spec["job_id"]
    assert _mode(host.root) == 0o700
    for d in (job, job / "attempts" / "1", job / "ckpt", job / "result", job / "run"):
        assert _mode(d) == 0o700, d
    for f in (job / "attempts" / "1" / "exit.json", job / "attempts" / "1" / "job.log",
              job / "attempts" / "1" / "run.env", job / "run" / "seen.json", host.root / "agent.log"):
        assert _mode(f) == 0o600, f
