"""examples/lightning_cli run end to end as a new user would (issue 29): a LightningCLI app (CSVLogger,
ModelCheckpoint(save_last=True), `fit --ckpt_path {checkpoint}`), unchanged, in DDP with 2 CPU ranks
(gloo), under both launchers at once:

- on a namespace SSH host, `launcher = "python"` (Lightning starts rank 1 itself): rank 1 is kill -9'd
  mid-run, the attempt is `killed` and requeued with resume, and the job resumes from its own last.ckpt
  into the next version_N;
- on the local host, the same example under torchrun (Lightning finds torchelastic's environment).

Each job's seed comes from `{seed}` in its line's own arguments (Lightning's saved config says so); the
example's own grid (lr x seeds=2) is checked as the dry run renders it.  Then `gpuq results` gives each
job's final val_loss from its newest version_N, and `gpuq pull` brings home every `epoch=N-step=M.ckpt`
and last.ckpt, verified, from both hosts.

CPU is the cost that matters (the suite runs on 2 cores): Lightning's import is about 5 s of CPU per
process, so the test runs 2 jobs, 6 Lightning processes in all (2 ranks each, 2 more for the resume),
two sweeps side by side, epochs of a few small batches; the waits sleep.  How a rank's death is
classified, under both launchers, is tests/integration/test_peer_death.py's (with a stand-in trainer);
here it is the real trainer's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import wait_for
from tests.support.gpuquser import User
from tests.support.lightningapp import checkpoints, missing, story, val_losses, versions, warm_bytecode
from tests.support.ownproject import copy_example
from tests.support.testhosts import HostFarm

MISSING = missing()  # CI installs them: README's test command installs the `examples` extra
pytestmark = [pytest.mark.integration, pytest.mark.honest,
              pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]

EPOCHS = 4
DDP = f"--trainer.max_epochs={EPOCHS} --trainer.devices=2 --trainer.accelerator=cpu --trainer.strategy=ddp"
# the hosts have no network; the requirements are installed already, so the hook's pip needs none
OFFLINE = 'env = { PIP_NO_INDEX = "1", PIP_DISABLE_PIP_VERSION_CHECK = "1" }\n'


@pytest.fixture
def user(host_farm: Callable[..., HostFarm], gpuq_home: Path) -> Iterator[User]:
    u = User(host_farm(n=1, gpus=2), gpuq_home, "/root/gpuq-lit")  # the local host's agent: gpuq_home's
    u.env.update({"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_PATROL_INTERVAL_S": "1", "GPUQ_PATROL_MIN_INTERVAL_S": "0.5",
                  "GPUQ_PREFLIGHT_SAMPLES": "1", "GPUQ_KILL_GRACE_S": "2", "GPUQ_STALL_AFTER_S": "300",
                  "GPUQ_STARTUP_GRACE_S": "300"})
    yield u
    u.stop_everything()


def _submit(user: User, queue: Path, host: str, sweeps: list[str]) -> dict[str, str]:
    """Submit ``queue`` to ``host``; its jobs' ids by name (its sweep id added to ``sweeps``)."""
    submitted = user.gpuq("submit", str(queue), "--host", host, "--json", timeout=600)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    doc = json.loads(submitted.stdout)
    sweeps.append(doc["sweep"])
    return {j["name"]: j["id"] for j in doc["jobs"]}


def test_lightning_cli_ddp_under_both_launchers_seeds_kill_resume_results_and_pull(
        user: User, gpuq_home: Path, tmp_path: Path) -> None:
    # the example's own grid, as the dry run renders it: lr x seeds=2, {seed} in the line's own arguments
    dry = user.gpuq("submit", "--dry-run", "--json", str(copy_example("lightning_cli", tmp_path / "grid")))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    grid = {job["name"]: job["argv"] for job in json.loads(dry.stdout)["jobs"]}
    assert sorted(grid) == [f"lit-lr{lr}-seed{seed}" for lr in ("0.01", "0.1") for seed in (0, 1)], grid
    for name, argv in grid.items():
        assert argv[argv.index("--seed_everything") + 1] == name[-1] and f"--model.lr={name[6:-6]}" in argv, argv

    warm_bytecode(tmp_path / "warm")
    user.add_hosts(1)
    ssh_queue = copy_example("lightning_cli", tmp_path / "ssh", toml_extra=OFFLINE, queue=(
        f"name=lit seed=1 gpus=2 retries=1 -- fit --config config.yaml --seed_everything {{seed}} "
        f"--model.lr=0.05 {DDP} --model.epoch_sleep=2.5\n"))
    local_queue = copy_example("lightning_cli", tmp_path / "local", toml_extra=OFFLINE, queue=(
        f"name=tr seed=2 gpus=2 -- fit --config config.yaml --seed_everything {{seed}} {DDP}\n"))
    toml = local_queue.parent / "gpuq.toml"
    toml.write_text(toml.read_text().replace('launcher = "python"', 'launcher = "torchrun"', 1))

    sweeps: list[str] = []
    ids = {**_submit(user, ssh_queue, "g0", sweeps), **_submit(user, local_queue, "local", sweeps)}
    assert sorted(ids) == ["lit", "tr"]
    ssh_root, local_root = user.host_dir(0), gpuq_home / "local"
    job_dir = {name: (local_root if name == "tr" else ssh_root) / "jobs" / job_id for name, job_id in ids.items()}
    victim = job_dir["lit"]
    first_log = victim / "attempts" / "1" / "job.log"

    def rank1_in_epoch_2() -> str | None:
        """Rank 1's pid once its second epoch's hook has printed (after that epoch's work and sleep):
        both ranks then passed the barriers that end the first epoch's checkpoint saves, so version_0's
        last.ckpt is complete, and epochs 3 and 4 (2.5 s of sleep each, so that the kill over ssh lands in them
        on a loaded machine) are still to run."""
        text = first_log.read_text(errors="replace") if first_log.is_file() else ""
        found = re.findall(rf"epoch 2/{EPOCHS} rank 1 pid (\d+)", text)  # mid-line: Rich's bar ends in none
        return found[0] if found else None

    assert wait_for(rank1_in_epoch_2, timeout=400, interval=0.2), story(ssh_root, local_root)
    pid = rank1_in_epoch_2()
    assert pid is not None
    user.farm.ssh(0, "kill", "-9", pid)  # rank 1 only, in the host's own PID namespace, no warning
    for sweep in sweeps:
        waited = user.gpuq("wait", "--sweep", sweep, "--timeout", "600", timeout=700)
        assert waited.returncode == 0, waited.stdout + waited.stderr + story(ssh_root, local_root)

    ledger = Ledger(gpuq_home / "ledger.db")
    try:
        jobs = {j.name: j for j in ledger.jobs()}
        events = [e.message for e in ledger.events(subject=ids["lit"], limit=200)]
    finally:
        ledger.close()
    assert {j.state for j in jobs.values()} == {"SUCCEEDED"}, (jobs, events, story(ssh_root, local_root))
    assert {n: j.attempt_count for n, j in jobs.items()} == {"lit": 2, "tr": 1}, events
    assert any("killed: requeued with resume" in m for m in events), events
    assert not any(m.startswith(("stopped", "unknown", "failed")) for m in events), events

    for name, jdir in job_dir.items():  # two ranks of Lightning's DDP, each launched as the sweep said
        log = (jdir / "attempts" / "1" / "job.log").read_text(errors="replace")
        assert re.search(rf"epoch 1/{EPOCHS} rank 1 pid \d+", log), log[-3000:]
        header = next(line for line in log.splitlines() if line.startswith("=== gpuq "))  # the argv it ran
        assert ("torch.distributed.run" in header) == (name == "tr"), header
    for name, seed in (("lit", 1), ("tr", 2)):  # each job ran with its own seed (Lightning's record of its config)
        saved = (versions(job_dir[name] / "run")[0] / "config.yaml").read_text()
        assert f"seed_everything: {seed}\n" in saved, saved

    # attempt 2 resumed from the job's own last.ckpt and logged to the next version_N
    second_log = (victim / "attempts" / "2" / "job.log").read_text(errors="replace")
    own = victim / "run" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    on_host = "/root/gpuq-lit" / own.relative_to(ssh_root)  # the path the host's trainer was given
    header = next(line for line in second_log.splitlines() if line.startswith("=== gpuq "))
    assert f"--ckpt_path {on_host}" in header or f"--ckpt_path '{on_host}'" in header, header
    assert "gpuq: resuming from checkpoint lightning_logs/version_0/checkpoints/last.ckpt" in second_log
    assert "Restored all states from the checkpoint" in second_log, second_log[-3000:]
    run_versions = versions(victim / "run")
    assert [v.name for v in run_versions] == ["version_0", "version_1"], run_versions
    before, after = (val_losses(v / "metrics.csv") for v in run_versions)
    assert before and after and after[0][0] > 0 and after[-1][0] == EPOCHS - 1, (before, after)
    assert before[-1][0] < EPOCHS - 1, before  # killed before the end: version_0 alone is not the answer

    # every job's final metric is Lightning's last val_loss, from its newest version_N
    final: dict[str, float | None] = {}
    for sweep in sweeps:
        results = user.gpuq("results", "--sweep", sweep, "--json")
        assert results.returncode == 0, results.stderr
        final.update({j["name"]: j["final"].get("val_loss") for j in json.loads(results.stdout)["jobs"]})
    expected = {name: val_losses(versions(jdir / "run")[-1] / "metrics.csv")[-1][1] for name, jdir in job_dir.items()}
    assert final == pytest.approx(expected), (final, expected)

    # the pull brings Lightning's own checkpoint names home, verified, from both hosts
    pulled_to: dict[str, Path] = {}
    for sweep in sweeps:
        pulled = user.gpuq("pull", "--sweep", sweep, "--json", timeout=600)
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        for job in json.loads(pulled.stdout)["jobs"]:
            assert job["verified"] and job["state"] == "verified", job
            pulled_to[job["name"]] = Path(job["local_dir"])
    assert sorted(pulled_to) == sorted(job_dir)
    for name, jdir in job_dir.items():
        on_host_ckpts = checkpoints(jdir)
        assert any("/epoch=" in p for p in on_host_ckpts) and any(p.endswith("/last.ckpt") for p in on_host_ckpts)
        assert checkpoints(pulled_to[name]) == on_host_ckpts, name
        for rel in on_host_ckpts:
            assert (pulled_to[name] / rel).read_bytes() == (jdir / rel).read_bytes(), rel
