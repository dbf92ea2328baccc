"""A user's own project, unchanged, on the embedded local host: examples/ddp_snapshot (a plain argparse
torchrun DDP script with a grid), a setup hook that prepares data the jobs read, and a failing setup
hook.  See docs/your-project.md."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_gpuq, wait_for
from tests.support.ownproject import all_text_under, copy_example, data_prep_project, launches, states

pytestmark = pytest.mark.integration

SECRET = "wandb-secret-value-7f3a9c1e5b"
ENV = {"GPUQ_LOCAL_CPU_SLOTS": "4", "GPUQ_HEARTBEAT_S": "1"}
# proof that a forwarded secret reached the trainer, without ever writing its value (rank 0 writes it)
PROBE = ('    if os.environ.get("WANDB_API_KEY") is not None and int(os.environ["RANK"]) == 0:\n'
         '        import hashlib\n'
         '        with open("secret.sha256", "w") as f:\n'
         '            f.write(hashlib.sha256(os.environ["WANDB_API_KEY"].encode()).hexdigest() + "\\n")\n')


def _plain(line: str) -> str:
    """An argv line with quotes, commas and brackets dropped: ``['train.py', '6']`` -> ``train.py 6``."""
    return " ".join(re.sub(r"[\[\]'\",]", " ", line).split())


def _status(env: dict[str, str], outputs: list[str]) -> dict:
    out = run_gpuq("status", "--json", env=env)
    outputs.append(out.stdout + out.stderr)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _aborted_at_teardown(jdir: Path) -> bool:
    """torch's gloo teardown can abort a rank (SIGABRT, "terminate called without an active exception")
    after the script's last epoch on an oversubscribed 2-core box; gpuq then resumes the job as attempt 2,
    by design.  Accept exactly that: attempt 1 trained every epoch and died of the signal, and attempt 2
    started only after it ended and succeeded."""
    first, second = jdir / "attempts" / "1", jdir / "attempts" / "2"
    if (jdir / "attempts" / "3").exists() or not second.is_dir():
        return False
    log = (first / "job.log").read_text()
    ended = json.loads((first / "exit.json").read_text())
    return ("Epoch 6 | Training snapshot saved" in log and "SIGABRT" in log and ended["wrapper_code"] != 0
            and (second / "launch.json").stat().st_mtime >= (first / "exit.json").stat().st_mtime
            and json.loads((second / "exit.json").read_text())["wrapper_code"] == 0)


def test_grid_runs_each_cell_once_in_its_own_run_dir_side_by_side(gpuq_home: Path, tmp_path: Path) -> None:
    queue = copy_example("ddp_snapshot", tmp_path)
    dry = run_gpuq("submit", str(queue), "--dry-run", env=ENV)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    # every expanded job on its own line with its exact argv (however it is quoted)
    lines = [_plain(ln) for ln in dry.stdout.splitlines() if "--batch_size" in ln]
    assert len(lines) == 2, dry.stdout  # {16,32}: two jobs
    assert any("--batch_size 16" in ln for ln in lines) and any("--batch_size 32" in ln for ln in lines), lines
    assert all(("torchrun" in ln or "torch.distributed.run" in ln) and "train.py 6 2" in ln for ln in lines), lines
    assert json.loads(run_gpuq("status", "--json", env=ENV).stdout)["jobs"] == []  # a dry run records nothing

    done = run_gpuq("submit", str(queue), "--host", "local", "--wait", env=ENV, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(run_gpuq("status", "--json", env=ENV).stdout)
    jobs = doc["jobs"]
    names = sorted(j["name"] for j in jobs)
    assert len(names) == 2 and len(set(names)) == 2, names
    assert all(n.startswith("bs") for n in names) and "16" in names[0] + names[1] and "32" in "".join(names)
    assert {j["state"] for j in jobs} == {"SUCCEEDED"}, jobs
    local = gpuq_home / "local"
    ports, spans = [], []
    for job in jobs:
        run = local / "jobs" / job["id"] / "run"
        rows = (run / "metrics.csv").read_text().splitlines()
        assert rows[0] == "epoch,train_loss,val_acc" and len(rows) == 7, rows  # every epoch once, no resume
        assert (run / "snapshot.pt").is_file() and not (run / "snapshot.pt").is_symlink()
        attempts = launches(local, job["id"])
        assert len(attempts) == 1 or _aborted_at_teardown(local / "jobs" / job["id"]), attempts  # ran once
        log = (local / "jobs" / job["id"] / "attempts" / "1" / "job.log").read_text()
        assert "Resuming training" not in log and "Batchsize: " in log
        bs = "16" if "16" in job["name"] else "32"
        assert f"Batchsize: {bs}" in log  # the cell's own argument reached the script
        ports.append(attempts[0]["master_port"])
        attempt_dir = local / "jobs" / job["id"] / "attempts" / "1"
        spans.append(((attempt_dir / "launch.json").stat().st_mtime, (attempt_dir / "exit.json").stat().st_mtime))
    assert ports[0] != ports[1], ports  # two torchrun jobs on one host never share a rendezvous port
    (a0, a1), (b0, b1) = spans
    assert a0 < b1 and b0 < a1, spans  # their lifetimes overlapped: side by side, not one after another
    # the bundle is read-only and untouched: the jobs' snapshots are in their own run dirs only
    assert not list((local / "bundles").glob("*/workdir/snapshot.pt"))
    results = run_gpuq("results", env=ENV)
    assert results.returncode == 0 and "val_acc" in results.stdout, results.stdout + results.stderr
    pulled = run_gpuq("pull", env=ENV)  # outputs come home, verified; no best.pt is asked for
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    for job in jobs:
        home_rows = list((gpuq_home / "results").glob(f"*/{job['id']}/run/metrics.csv"))
        assert len(home_rows) == 1 and len(home_rows[0].read_text().splitlines()) == 7, home_rows


def test_forwarded_secret_reaches_only_the_trainer(gpuq_home: Path, tmp_path: Path) -> None:
    queue = copy_example("ddp_snapshot", tmp_path, queue="name=sec gpus=2 -- 2 1 --batch_size 64\n",
                         toml_extra='forward_env = ["WANDB_API_KEY"]\nenv = { WANDB_MODE = "offline" }\n')
    train = queue.parent / "train.py"  # the test's own probe (the example carries none): the secret's hash
    train.write_text(train.read_text().replace("    ddp_setup()\n", "    ddp_setup()\n" + PROBE, 1))
    env = {**ENV, "WANDB_API_KEY": SECRET, "GPUQ_FORWARD_ENV_ALLOW": "WANDB_API_KEY"}  # the user allows it
    outputs: list[str] = []
    dry = run_gpuq("submit", str(queue), "--dry-run", env=env)
    outputs.append(dry.stdout + dry.stderr)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    done = run_gpuq("submit", str(queue), "--host", "local", "--wait", env=env, timeout=600)
    outputs.append(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = _status(env, outputs)
    (job,) = doc["jobs"]
    assert job["state"] == "SUCCEEDED"
    for args in (("status", "--once"), ("results",), ("logs", job["id"])):
        out = run_gpuq(*args, env=env)
        outputs.append(out.stdout + out.stderr)
    local = gpuq_home / "local"
    proof = local / "jobs" / job["id"] / "run" / "secret.sha256"
    assert proof.read_text().strip() == hashlib.sha256(SECRET.encode()).hexdigest()  # it reached the trainer
    value = SECRET.encode()
    for i, text in enumerate(outputs):
        assert SECRET not in text, f"CLI output {i} shows the secret"
    leaks = [str(p) for p, data in all_text_under(gpuq_home, skip=()) if value in data
             and "secrets" not in p.relative_to(gpuq_home).parts[:2]]
    assert not leaks, leaks  # ledger.db, bundles/*.tar*, every file under the host root but secrets/
    assert (gpuq_home / "ledger.db").is_file() and (gpuq_home / "bundles").is_dir()


def test_failing_setup_is_one_clear_error_and_loses_nothing(gpuq_home: Path, tmp_path: Path) -> None:
    failing = 'setup = "echo fetching wheels; echo ERROR: no matching distribution >&2; exit 3"\n'
    queue = copy_example("ddp_snapshot", tmp_path, queue="name=a gpus=1 -- 2 1\nname=b gpus=1 -- 2 1\n",
                         toml_extra=failing)
    submitted = run_gpuq("submit", str(queue), "--host", "local", env=ENV)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    seen: list[str] = []

    def setup_failure_reported() -> bool:
        out = run_gpuq("status", "--once", env=ENV)
        seen.append(out.stdout + out.stderr)
        return "setup failed" in out.stdout

    assert wait_for(setup_failure_reported, timeout=120, interval=1.0), seen[-1:]
    report = seen[-1]
    assert re.search(r"setup failed.*\blocal\b", report) and "no matching distribution" in report, report
    assert "Traceback" not in report
    doc = json.loads(run_gpuq("status", "--json", env=ENV).stdout)
    assert sorted(j["name"] for j in doc["jobs"]) == ["a", "b"]
    assert "FAILED" not in {j["state"] for j in doc["jobs"]}, doc["jobs"]  # nothing lost, no retry spent
    # the setup ran once on this host for the bundle, its output in its own log; the trainer never started
    local = gpuq_home / "local"
    logs = list(local.glob("setup/*/setup.log"))
    assert len(logs) == 1 and "no matching distribution" in logs[0].read_text()
    assert not list(local.glob("jobs/*/run/metrics.csv"))
    assert states(doc) and run_gpuq("status", "--once", env=ENV).returncode == 0  # ledger still readable


def test_setup_that_prepares_data_serves_every_job_read_only(gpuq_home: Path, tmp_path: Path) -> None:
    queue = data_prep_project(tmp_path)
    done = run_gpuq("submit", str(queue), "--host", "local", "--wait", env=ENV, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    local = gpuq_home / "local"
    doc = json.loads(run_gpuq("status", "--json", env=ENV).stdout)
    assert {j["state"] for j in doc["jobs"]} == {"SUCCEEDED"}, [
        p.read_text()[-1500:] for p in local.glob("jobs/*/attempts/*/job.log")]
    for job in doc["jobs"]:
        rows = (local / "jobs" / job["id"] / "run" / "metrics.csv").read_text().splitlines()
        assert rows[1] == "1,1000,0", rows  # every job read the hook's data and could not write it
    # a code change is a new bundle with the same setup key: the hook's data serves it, not run again
    train = queue.parent / "train.py"
    train.write_text(train.read_text() + "# tuned\n")
    queue.write_text("name=c -- 3\n")
    again = run_gpuq("submit", str(queue), "--host", "local", "--wait", env=ENV, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    (job,) = [j for j in json.loads(run_gpuq("status", "--json", env=ENV).stdout)["jobs"] if j["name"] == "c"]
    assert job["state"] == "SUCCEEDED", [p.read_text()[-1500:] for p in local.glob("jobs/*/attempts/*/job.log")]
    run = local / "jobs" / job["id"] / "run"
    assert (run / "metrics.csv").read_text().splitlines()[1] == "1,1000,0"
    assert (run / "train.py").read_text().endswith("# tuned\n")  # the new code, beside the old data
    (log,) = local.glob("setup/*/setup.log")
    assert log.read_text().count("prepared data/train.txt") == 1  # once per host and setup key
