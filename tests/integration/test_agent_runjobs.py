"""The host agent on a job of a project's own trainer (spec "run": no heartbeat, no metrics.jsonl, no
summary.json, no ckpt/LATEST): `manifest`, `snapshot`, `collect` and `status --json`, run as real
subprocesses on fabricated job trees (like test_agent_manifest.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.core import filenames, protocol
from orchestrator.host_documents import unframe
from orchestrator.transfer.verify import parse_manifest
from tests.support.jobspecs import spec_doc
from tests.support.jobtree import SHA, install_agent
from tests.support.testhosts import default_gpus

pytestmark = pytest.mark.integration

AGENT_PY = os.environ.get("GPUQ_TEST_AGENT_PYTHON") or sys.executable
RUN = {"command": ["train.py", "{args}"], "launcher": "python", "checkpoint": ["snapshot.pt", "ckpts/*.ckpt"],
       "outputs": ["outputs/**", "*.json"], "metrics": "logs/metrics.csv", "metric": "val_acc", "mode": "max",
       "progress": r"Epoch (?P<epoch>\d+)/(?P<total>\d+)"}
CSV = "epoch,step,train_loss,val_acc\n0,9,0.9,\n0,9,,0.6\n1,19,0.7,\n1,19,,0.8\n2,29,0.6,\n2,29,,0.7\n"


def agent(root: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    entry = root / protocol.BUNDLES_DIR / SHA / protocol.AGENT_ENTRY
    proc = subprocess.run([AGENT_PY, str(entry), "--root", str(root), *args],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    doc = json.loads(unframe(proc.stdout)[0]) if proc.stdout.strip() else None
    return proc.returncode, doc, proc.stderr


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    install_agent(r)
    return r


def run_job(root: Path, job_id: str, *, code: int | None = 0, run: dict[str, Any] | None = None) -> Path:
    """A job of a project's own trainer: files in its run dir, a log, an exit record when ``code``."""
    jdir = root / protocol.JOBS_DIR / job_id
    adir = jdir / protocol.ATTEMPTS_DIR / "1"
    rdir = jdir / protocol.RUN_DIR
    for d in (adir, rdir / "outputs" / "plots", rdir / "logs", rdir / "ckpts", root / protocol.CLAIMED_DIR):
        d.mkdir(parents=True, exist_ok=True)
    (root / protocol.CLAIMED_DIR / f"{job_id}.json").write_text(json.dumps(
        spec_doc(job_id=job_id, queue_id="qrun01", attempt=1, name=job_id, run=run or RUN)))
    (rdir / "outputs" / "model.txt").write_text("weights")
    (rdir / "outputs" / "plots" / "curve.png").write_bytes(b"\x89PNG")
    (rdir / "final.json").write_text('{"ok": true}')
    (rdir / "logs" / "metrics.csv").write_text(CSV)
    (rdir / "scratch.bin").write_bytes(b"not an output")
    (rdir / "snapshot.pt").write_bytes(b"snap")
    (rdir / "project_file.json").symlink_to(root / protocol.BUNDLES_DIR)  # the project's files are links
    (rdir / "outputs" / "link.txt").symlink_to(rdir / "scratch.bin")
    (adir / protocol.JOB_LOG).write_text("start\nEpoch 2/4\nEpoch 3/4 loss=0.5\n")
    if code is not None:
        (adir / protocol.EXIT_FILE).write_text(json.dumps({"job_id": job_id, "attempt": 1, "wrapper_code": code}))
    return jdir


def test_manifest_of_a_project_job_lists_outputs_metrics_summary_and_evidence(root: Path) -> None:
    jdir = run_job(root, "c000000000101")
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not the job's")
    (jdir / "run" / "outputs" / "ckpt dir").mkdir()
    (jdir / "run" / "outputs" / "ckpt dir" / "linked").symlink_to(elsewhere)  # a symlinked dir is never walked...
    (jdir / "run" / "outputs" / "bad name.txt").write_text("a space is an ordinary character")
    (jdir / "run" / "outputs" / "model.txt.tmp").write_text("an interrupted write")
    code, doc, err = agent(root, "manifest", "c000000000101")
    # ...and a link out of the run dir that a glob matches is never left behind in silence
    assert code == 1 and doc["c000000000101"]["error"] == (
        "1 path(s) that [run] outputs/checkpoint match cannot travel: 'outputs/ckpt dir/linked': a link out of "
        "the job's run dir (rename them, or narrow the globs)")
    (jdir / "run" / "outputs" / "ckpt dir" / "linked").unlink()
    code, doc, err = agent(root, "manifest", "c000000000101")
    assert code == 0, err
    raw = Path(doc["c000000000101"]["manifest"]).read_bytes()
    parse_manifest(raw, job_id="c000000000101", required=())  # the controller's pull accepts it as it is
    man = json.loads(raw)
    paths = {f["path"] for f in man["files"]}
    # the checkpoint (snapshot.pt) comes home too; a link to the job's own file as that file; the project's
    # links (project_file.json) are not the job's
    assert paths == {"run/outputs/model.txt", "run/outputs/plots/curve.png", "run/final.json", "run/snapshot.pt",
                     "run/outputs/bad name.txt", "run/outputs/link.txt", "run/logs/metrics.csv",
                     "result/summary.json", "attempts/1/job.log", "attempts/1/exit.json"}
    for entry in man["files"]:  # no best.pt required, no scratch file
        data = (jdir / entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    summary = json.loads((jdir / "result" / "summary.json").read_text())
    assert summary["best"]["val_acc"] == 0.8 and summary["final"]["val_acc"] == 0.7
    assert summary["final"]["step"] == 29 and summary["metric"] == "val_acc"


LIGHTNING_HF = {"command": ["train.py"], "launcher": "python", "outputs": ["lightning_logs/**"],
                "checkpoint": ["**/last.ckpt", "out/checkpoint-*"]}


def test_a_pull_brings_every_file_lightning_and_hf_write_or_names_what_it_refused(root: Path) -> None:
    """Real names (``epoch=19-step=40.ckpt``, ``checkpoint-500/``, ``model.safetensors``) all come home; a link
    the job made to its own file (``save_last: link``) as that file; a name that cannot travel refuses the
    manifest, named, so the pull is never "verified" with a file left behind."""
    jdir = run_job(root, "c000000000107", run=LIGHTNING_HF)
    rdir = jdir / "run"
    ckpts = rdir / "lightning_logs" / "version_0" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "epoch=19-step=40.ckpt").write_bytes(b"lightning weights")
    (ckpts / "last.ckpt").symlink_to("epoch=19-step=40.ckpt")
    (rdir / "lightning_logs" / "version_0" / "metrics.csv").write_text(CSV)
    (rdir / "lightning_logs" / "version_0" / "hparams.yaml").write_text("lr: 0.1\n")
    hf = rdir / "out" / "checkpoint-500"
    hf.mkdir(parents=True)
    for name in ("model.safetensors", "trainer_state.json", "optimizer.pt"):
        (hf / name).write_bytes(name.encode())
    code, doc, err = agent(root, "manifest", "c000000000107")
    assert code == 0, err
    raw = Path(doc["c000000000107"]["manifest"]).read_bytes()
    parse_manifest(raw, job_id="c000000000107", required=())  # the controller accepts every one of these names
    files = {f["path"]: f for f in json.loads(raw)["files"]}
    lightning = "run/lightning_logs/version_0/"
    assert {p for p in files if p.startswith("run/")} == {
        lightning + "checkpoints/epoch=19-step=40.ckpt", lightning + "checkpoints/last.ckpt",
        lightning + "metrics.csv", lightning + "hparams.yaml", "run/out/checkpoint-500/model.safetensors",
        "run/out/checkpoint-500/trainer_state.json", "run/out/checkpoint-500/optimizer.pt"}
    assert files[lightning + "checkpoints/last.ckpt"]["sha256"] == hashlib.sha256(b"lightning weights").hexdigest()
    (ckpts / "epoch=20\x1b[2J.ckpt").write_bytes(b"a control character")
    code, doc, _ = agent(root, "manifest", "c000000000107")
    assert code == 1 and doc["c000000000107"]["error"] == (
        "1 path(s) that [run] outputs/checkpoint match cannot travel: "
        "'lightning_logs/version_0/checkpoints/epoch=20\\x1b[2J.ckpt': a control character in the name "
        "(rename them, or narrow the globs)")


def test_snapshot_copies_a_complete_checkpoint_directory_file_by_file(root: Path) -> None:
    jdir = run_job(root, "c000000000108", code=None, run=LIGHTNING_HF)
    then = time.time() - 60
    hf = jdir / "run" / "out" / "checkpoint-500"
    hf.mkdir(parents=True)
    files = {"model.safetensors": b"w", "trainer_state.json": b"{}", "rng state/r.pth": b"r"}
    for name, data in files.items():
        (hf / name).parent.mkdir(parents=True, exist_ok=True)
        (hf / name).write_bytes(data)
        os.utime(hf / name, (then, then))
    (jdir / "run" / "out" / "checkpoint-600").mkdir()
    (jdir / "run" / "out" / "checkpoint-600" / "model.safetensors").write_bytes(b"killed mid-save")
    code, doc, err = agent(root, "snapshot", "c000000000108")
    assert code == 0, err
    listed = [(f["path"], f["bytes"], f["sha256"]) for f in doc["files"]]
    assert sorted(listed) == sorted((p, len(d), hashlib.sha256(d).hexdigest()) for p, d in files.items())
    assert (doc["file"], doc["dir"], doc["snapshot"]) == ("run/out/checkpoint-500", True, "ckpt/.ship.d")
    assert doc["sha256"] == filenames.tree_sha256(listed) and doc["bytes"] == 4
    assert (jdir / "ckpt" / ".ship.d" / "rng state" / "r.pth").read_bytes() == b"r"


def test_manifest_of_a_failed_project_job_is_refused(root: Path) -> None:
    run_job(root, "c000000000102", code=1)
    code, doc, _ = agent(root, "manifest", "c000000000102")
    assert code == 1 and "exited 1" in doc["c000000000102"]["error"]


def test_collect_summarizes_the_projects_metrics(root: Path) -> None:
    jdir = run_job(root, "c000000000103")
    code, doc, err = agent(root, "collect", "c000000000103")
    assert code == 0, err
    s = doc["c000000000103"]["summary"]
    assert (s["metric"], s["mode"], s["best"]["val_acc"], s["final"]["val_acc"]) == ("val_acc", "max", 0.8, 0.7)
    assert json.loads((jdir / "result" / "summary.json").read_text()) == s
    assert {"path": "result/summary.json"}.items() <= doc["c000000000103"]["files"][0].items()


def test_snapshot_pins_the_newest_checkpoint_glob_match(root: Path) -> None:
    jdir = run_job(root, "c000000000104", code=None)
    rdir = jdir / protocol.RUN_DIR
    (rdir / "ckpts" / "epoch=3.ckpt").write_bytes(b"newest")
    os.utime(rdir / "snapshot.pt", (1000, 1000))
    code, doc, err = agent(root, "snapshot", "c000000000104")
    assert code == 0, err
    assert doc["file"] == "run/ckpts/epoch=3.ckpt" and doc["step"] is None
    assert doc["snapshot"] == "ckpt/.ship.pt" and doc["bytes"] == 6
    assert doc["sha256"] == hashlib.sha256(b"newest").hexdigest()
    ship = jdir / "ckpt" / ".ship.pt"
    assert ship.read_bytes() == b"newest"
    # a copy, not a link: a trainer that rewrites its file in place (torch.save to the same path) must
    # not change the bytes the controller is copying
    with open(rdir / "ckpts" / "epoch=3.ckpt", "r+b") as f:
        f.write(b"XXXXXX")
    assert ship.read_bytes() == b"newest"
    # a symlink is never a checkpoint, even the newest
    (rdir / "ckpts" / "epoch=9.ckpt").symlink_to("/etc/hostname")
    code, doc, _ = agent(root, "snapshot", "c000000000104")
    assert code == 0 and doc["file"] == "run/ckpts/epoch=3.ckpt"


def test_snapshot_without_a_match_says_so(root: Path) -> None:
    jdir = run_job(root, "c000000000105", code=None)
    for p in ("snapshot.pt",):
        (jdir / protocol.RUN_DIR / p).unlink()
    code, doc, err = agent(root, "snapshot", "c000000000105")
    assert code == 1 and doc is None and "matches the checkpoint globs" in err


@pytest.fixture
def live_group() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_status_reports_progress_and_checkpoint_mtime_of_a_running_project_job(
        root: Path, live_group: int, tmp_path: Path) -> None:
    jdir = run_job(root, "c000000000106", code=None)
    adir = jdir / protocol.ATTEMPTS_DIR / "1"
    (adir / protocol.LAUNCH_FILE).write_text(json.dumps({"time": time.time(), "slots": [1]}))
    gpus = default_gpus("t", 2)
    gpus[1]["utilization.gpu"] = 87
    state = tmp_path / "gpus.json"
    state.write_text(json.dumps({"driver_version": "550.54.15", "broken": False, "gpus": gpus}))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = Path(__file__).resolve().parents[1] / "support" / "fake_nvidia_smi.py"
    (bindir / "nvidia-smi").write_text(f'#!/bin/sh\nexec {sys.executable} -I -S {fake} --state {state} "$@"\n')
    (bindir / "nvidia-smi").chmod(0o755)
    stat = Path(f"/proc/{live_group}/stat").read_text()
    ticks = int(stat[stat.rindex(")") + 2:].split()[19])
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    (adir / protocol.PGID_FILE).write_text(json.dumps({"pgid": live_group, "start_ticks": ticks, "boot_id": boot}))
    os.utime(jdir / protocol.RUN_DIR / "snapshot.pt", (5000, 5000))
    code, doc, err = agent(root, "status", "--json", env=dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin"))
    assert code == 0, err
    entry = next(j for j in doc["jobs"] if j["job_id"] == "c000000000106")
    assert entry["gpu_util_pct"] == 87  # its own GPU (slot 1), not GPU 0
    assert entry["state"] == "running"
    p = entry["progress"]
    assert (p["epoch"], p["total"], p["pct"], p["source"]) == (3, 4, 75.0, "regex")
    assert p["line"] == "Epoch 3/4 loss=0.5"
    assert entry["run_ckpt_mtime"] == 5000


def test_results_show_the_headline_metric_of_a_summary_from_a_csv(
        root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`gpuq results` on a job whose summary the agent computed from a project's CSV: final and best
    of the headline metric, whatever trainer wrote it."""
    from orchestrator.context import open_context
    from orchestrator.core.specs import JobSpec
    from orchestrator.core.states import JobState
    from orchestrator.host_documents import CollectDocument
    from orchestrator.tick.collect import record_collected
    from tests.conftest import run_gpuq

    home = tmp_path / "home"
    monkeypatch.setenv("GPUQ_HOME", str(home))
    ctx = open_context()
    spec = JobSpec(name="csvjob", config="c.yaml", task="classify", config_sha256="0" * 64, line=1)
    job_id = ctx.ledger.add_sweep(sweep_id="qcsv001", queue_path="q.txt", workdir=str(tmp_path), queue_text="x",
                                  jobs=[spec], default_retries=1)[0].id
    for state in (JobState.ASSIGNED, JobState.RUNNING, JobState.SUCCEEDED):
        ctx.ledger.transition(job_id, state)
    run_job(root, job_id)
    code, doc, err = agent(root, "collect", job_id)
    assert code == 0, err
    record_collected(ctx.ledger, CollectDocument.model_validate(doc).root)  # through the edge model
    table = run_gpuq("results", env={"GPUQ_HOME": str(home), "COLUMNS": "250"})
    assert table.returncode == 0, table.stderr
    line = next(ln for ln in table.stdout.splitlines() if job_id in ln)
    header = next(ln for ln in table.stdout.splitlines() if "final val_acc" in ln)
    assert "best val_acc (max)" in header
    assert "0.7000" in line and "0.8000" in line
    rows = run_gpuq("results", "--csv", env={"GPUQ_HOME": str(home)}).stdout.splitlines()
    cols = rows[0].split(",")
    values = dict(zip(cols, next(r for r in rows if r.startswith(job_id)).split(","), strict=False))
    assert (float(values["final_val_acc"]), float(values["best_val_acc"])) == (0.7, 0.8)
