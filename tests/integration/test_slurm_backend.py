"""gpuq on a real Slurm cluster (tests/support/slurmcluster/): slurmctld on a login host, slurmd on
two compute hosts, every host a namespace with its own sshd; the gpuq root lies on the directory the
hosts share.  gpuq reaches the login node over SSH like any host and submits each job with sbatch.

Covered: registration (the audit's shared-filesystem probe), a sweep runs to completion within the
job cap; ``scontrol requeue`` mid-run continues the same attempt from its checkpoint to the weights of
an uninterrupted twin, with no second copy; a compute node whose slurmd dies fails its job NODE_FAIL
and gpuq resumes it; ``gpuq cancel`` reaches scancel.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.ledger import Ledger
from tests.conftest import ROOT, run_gpuq, wait_for
from tests.support.lightproject import light_config, light_project
from tests.support.slurmcluster import SlurmCluster, requirements_problem
from tests.support.sweepproject import CKPT_EVERY, final_weights, latest_step, tiny_config, write_project
from tests.support.testhosts import HostFarm

pytestmark = pytest.mark.integration



@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    problem = requirements_problem()
    if problem:
        pytest.fail(problem, pytrace=False)
    farm = HostFarm(tmp_path_factory.mktemp("slurmfarm"), 3, gpus=2, routed=True).start()
    try:
        with SlurmCluster(farm, login=0, compute=(1, 2), gpus_per_node=2, cpus_per_node=2) as c:
            yield c
    finally:
        farm.teardown()


class SlurmUser:
    def __init__(self, cluster: SlurmCluster, home: Path, root: Path) -> None:
        self.cluster = cluster
        self.home = home
        self.root = root  # on the shared directory: the login node, the nodes and this test see it
        self.env = {"GPUQ_HOME": str(home), "GPUQ_HEARTBEAT_S": "1"}

    def gpuq(self, *args: str, timeout: float = 300) -> tuple[int, str]:
        out = run_gpuq(*args, env=self.env, timeout=timeout)
        return out.returncode, out.stdout + out.stderr

    def add(self, *extra: str) -> str:
        farm = self.cluster.farm
        code, text = self.gpuq("hosts", "add", "hpc", "--slurm", f"root@{farm.hosts[0].address}",
                               "--key", str(farm.client_key), "--profile", "rehearsal", "--root", str(self.root),
                               "--trust-new-host-key", *extra)
        assert code == 0, text
        return text

    def job_dir(self, name: str) -> Path:
        for spec in self.root.glob("jobs/*/spec.json"):
            if json.loads(spec.read_text()).get("name") == name:
                return spec.parent
        raise AssertionError(f"no job {name} under {self.root}")

    def slurm_id(self, name: str, attempt: int = 1) -> str:
        return str(json.loads((self.job_dir(name) / "attempts" / str(attempt) / "slurm.json").read_text())["job_id"])

    def jobs(self) -> dict[str, object]:
        ledger = Ledger(self.home / "ledger.db")
        try:
            return {j.name: j for j in ledger.jobs()}
        finally:
            ledger.close()

    def history(self, name: str) -> str:
        """The job's attempts and events, for a failing assertion."""
        ledger = Ledger(self.home / "ledger.db")
        try:
            job = next(j for j in ledger.jobs() if j.name == name)
            lines = [f"attempt {a.number}: {a.state} exit={a.exit_code} step={a.step} {a.message}"
                     for a in ledger.attempts(job.id)]
            lines += [f"event: {e.message}" for e in ledger.events(subject=job.id, limit=50)]
        finally:
            ledger.close()
        return "\n" + "\n".join(lines) + "\n"

    def logs(self) -> str:
        out = []
        for log in sorted(self.root.glob("jobs/*/attempts/*/job.log")):
            out.append(f"--- {log}\n{log.read_text(errors='replace')[-2500:]}")
        return "\n".join(out)


@pytest.fixture
def user(cluster: SlurmCluster, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[SlurmUser]:
    home = tmp_path / "home"
    home.mkdir()
    root = cluster.shared_dir / f"gpuq-{request.node.name[:40]}"
    u = SlurmUser(cluster, home, root)
    yield u
    for job in cluster.squeue():  # whatever this test left in Slurm's queue
        if not job.ended and job.name.startswith("gpuq-"):
            cluster.scancel(job.job_id)








def test_a_sweep_runs_to_completion_as_slurm_jobs_within_the_cap(user: SlurmUser, tmp_path: Path) -> None:
    said = user.add("--max-jobs", "2", "--time-limit", "10")
    assert "2 GPUs per node" in said and "shared with the compute nodes: yes" in said, said
    assert json.loads((user.root / "slurm.json").read_text())["max_jobs"] == 2
    # the light stdlib trainer (tests/support/lightproject.py): what is under test is the cap, not training
    queue = light_project(tmp_path, {"tiny": light_config(steps=4, step_s=0.25)},
                          [f"configs/tiny.yaml classify 1 name=c{i} gpus=1 seed={i}" for i in range(3)])
    code, text = user.gpuq("submit", str(queue))
    assert code == 0, text
    submitted = [p for p in user.root.glob("jobs/*/attempts/1/slurm.json")]
    assert len(submitted) == 2, text  # the cap: the third waits in gpuq, not in Slurm's queue
    code, text = user.gpuq("wait", "--timeout", "300", timeout=400)
    assert code == 0, text + user.logs()
    jobs = user.jobs()
    assert sorted(jobs) == ["c0", "c1", "c2"] and all(j.state == "SUCCEEDED" for j in jobs.values()), jobs
    for name in jobs:
        sid = user.slurm_id(name)
        job = user.cluster.job(sid)
        assert job is not None and job.state == "COMPLETED", job
        assert job.name.startswith("gpuq-") and job.name.endswith(f"-{name}"), job
        script = (user.job_dir(name) / "attempts" / "1" / "sbatch.sh").read_text()
        assert "wrap" in script and str(user.root) in script
        run_env = (user.job_dir(name) / "attempts" / "1" / "run.env").read_text()
        assert "CUDA_VISIBLE_DEVICES=0" in run_env or "CUDA_VISIBLE_DEVICES=1" in run_env, run_env
    code, text = user.gpuq("status", "--json")
    assert code == 0, text
    assert not (user.root / "agent.pid").exists()  # no agent ever served the login node's root
    hosts = {h["name"]: h for h in json.loads(text)["hosts"]}
    assert hosts["hpc"]["reachable"] is True, hosts
    login = user.cluster.farm.hosts[0].address
    assert login in (user.home / "known_hosts").read_text()
    code, text = user.gpuq("hosts", "rm", "hpc", "--force")
    assert code == 0, text
    assert login not in (user.home / "known_hosts").read_text()  # the login node's key goes with the host


def test_a_slurm_requeue_continues_the_attempt_from_its_checkpoint(user: SlurmUser, tmp_path: Path) -> None:
    user.add()
    queue = write_project(tmp_path, {"victim": tiny_config(0.05, 1024), "twin": tiny_config(0.0, 1024)},
                          ["configs/victim.yaml classify 2 name=victim gpus=1",
                           "configs/twin.yaml classify 2 name=twin gpus=1"])
    code, text = user.gpuq("submit", str(queue))
    assert code == 0, text
    assert wait_for(lambda: latest_step(user.job_dir("victim")) >= 2 * CKPT_EVERY, timeout=240, interval=0.2), \
        user.logs()
    saved = latest_step(user.job_dir("victim"))
    sid = user.slurm_id("victim")
    user.cluster.requeue(sid)  # what a preemption with PreemptMode=REQUEUE does to the job
    code, text = user.gpuq("wait", "--timeout", "400", timeout=500)
    assert code == 0, text + user.logs()
    jobs = user.jobs()
    assert jobs["victim"].state == "SUCCEEDED" and jobs["twin"].state == "SUCCEEDED", jobs  # type: ignore[attr-defined]
    assert jobs["victim"].attempt_count == 1, jobs  # type: ignore[attr-defined]  # Slurm's requeue, not a 2nd copy
    victim = user.job_dir("victim")
    assert not (victim / "attempts" / "2").exists()
    log = (victim / "attempts" / "1" / "job.log").read_text()
    assert "runs this attempt again (restart 1)" in log, log[-3000:]
    # The stopped run wrote its exit record only if its wrapper finished before Slurm's KillWait ran out (a
    # SIGKILL writes nothing); when it did, the record was set aside and the log names it
    # (tests/unit/test_agent_slurm.py checks the set-aside itself).
    set_aside = (victim / "attempts" / "1" / "exit.slurm-0.json").is_file()
    assert set_aside == ("the stopped run's record is exit.slurm-0.json" in log), log[-3000:]
    resumed = [line for line in log.splitlines() if "GPUQ_RESUMED" in line]
    assert resumed and int(resumed[-1].split("step=")[1].split()[0]) >= saved, log[-3000:]
    assert final_weights(victim) == final_weights(user.job_dir("twin"))


def test_a_dead_node_is_requeued_by_slurm_and_the_attempt_resumes_elsewhere(user: SlurmUser, tmp_path: Path) -> None:
    user.add()
    queue = write_project(tmp_path, {"slow": tiny_config(0.05, 1024)},
                          ["configs/slow.yaml classify 2 name=slow gpus=1"])
    code, text = user.gpuq("submit", str(queue))
    assert code == 0, text
    assert wait_for(lambda: latest_step(user.job_dir("slow")) >= CKPT_EVERY, timeout=240, interval=0.2), user.logs()
    sid = user.slurm_id("slow")
    job = user.cluster.job(sid)
    assert job is not None and job.nodes in user.cluster.nodes, job
    dead = job.nodes
    user.cluster.stop_slurmd(dead, jobs=True)  # the node dies with its job; --requeue puts it back in the queue
    try:
        code, text = user.gpuq("wait", "--timeout", "400", timeout=500)
        assert code == 0, text + user.logs()
        final = user.cluster.job(sid)
    finally:
        user.cluster.start_slurmd(dead)
    jobs = user.jobs()
    assert jobs["slow"].state == "SUCCEEDED" and jobs["slow"].attempt_count == 1, jobs  # type: ignore[attr-defined]
    assert final is not None and final.state == "COMPLETED" and final.nodes != dead, final
    log = (user.job_dir("slow") / "attempts" / "1" / "job.log").read_text()
    assert "runs this attempt again (restart 1)" in log, log[-3000:]
    assert any("GPUQ_RESUMED" in line for line in log.splitlines()), log[-3000:]


def test_a_job_warned_of_its_time_limit_checkpoints_and_continues_in_a_new_slurm_job(user: SlurmUser,
                                                                                      tmp_path: Path) -> None:
    """The warning Slurm sends before the time limit (--signal=B:USR1@grace) is sent here by hand,
    at a known step (`scancel --batch --signal=USR1`, what slurmctld does; its own timing is up to a
    minute early and too coarse for a test): the payload saves a checkpoint, and gpuq continues the
    run in a new Slurm job without spending retries=, to the weights of an uninterrupted twin."""
    user.add("--time-limit", "30", "--signal-grace", "90")
    queue = write_project(tmp_path, {"long": tiny_config(0.05, 1024), "twin": tiny_config(0.0, 1024)},
                          ["configs/long.yaml classify 2 name=long gpus=1 retries=0",
                           "configs/twin.yaml classify 2 name=twin gpus=1"])
    code, text = user.gpuq("submit", str(queue))
    assert code == 0, text
    assert wait_for(lambda: latest_step(user.job_dir("long")) >= 2 * CKPT_EVERY, timeout=240, interval=0.2), \
        user.logs()
    sid = user.slurm_id("long")
    shown = user.cluster.show_job(sid)
    assert shown["TimeLimit"] == "00:30:00", shown  # --time-limit reached sbatch
    user.cluster.check_login(["scancel", "--batch", "--signal=USR1", sid])
    code, text = user.gpuq("wait", "--timeout", "400", timeout=500)
    assert code == 0, text + user.history("long") + user.logs()[-6000:]
    jobs = user.jobs()
    long = jobs["long"]
    assert long.state == "SUCCEEDED" and jobs["twin"].state == "SUCCEEDED", jobs  # type: ignore[attr-defined]
    assert long.attempt_count == 2, user.history("long")  # type: ignore[attr-defined]
    first = json.loads((user.job_dir("long") / "attempts" / "1" / "exit.json").read_text())
    assert first["slurm_time_limit"] is True and first["wrapper_signal"] == 15, first
    assert first["message"].startswith("Slurm time limit near (SIGUSR1): checkpointed and stopped"), first
    ledger = Ledger(user.home / "ledger.db")
    try:
        states = [a.state for a in ledger.attempts(long.id)]  # type: ignore[attr-defined]
    finally:
        ledger.close()
    assert states == ["PREEMPTED", "EXITED"], states  # a chunk is not a failure: retries=0 was enough
    log = (user.job_dir("long") / "attempts" / "2" / "job.log").read_text()
    resumed = [line for line in log.splitlines() if "GPUQ_RESUMED" in line]
    assert resumed and int(resumed[0].split("step=")[1].split()[0]) >= 2 * CKPT_EVERY, log[-3000:]
    assert final_weights(user.job_dir("long")) == final_weights(user.job_dir("twin"))


def test_a_two_node_job_trains_to_the_weights_of_the_same_world_on_one_node(user: SlurmUser, tmp_path: Path) -> None:
    """nodes=2 gpus=1 (one torchrun per node through srun, static rendezvous on node 0, gloo over the
    routed test network) against nodes=1 gpus=2: the same world size, so the same weights."""
    said = user.add()
    assert "2 GPUs per node" in said, said
    queue = write_project(tmp_path, {"tiny": tiny_config(0.0, 512)},
                          ["configs/tiny.yaml classify 2 name=spread nodes=2 gpus=1",
                           "configs/tiny.yaml classify 2 name=packed nodes=1 gpus=2"])
    code, text = user.gpuq("submit", str(queue))
    assert code == 0, text
    code, text = user.gpuq("wait", "--timeout", "300", timeout=400)
    assert code == 0, text + user.history("spread") + user.logs()[-6000:]
    jobs = user.jobs()
    assert jobs["spread"].state == "SUCCEEDED" and jobs["packed"].state == "SUCCEEDED", jobs  # type: ignore[attr-defined]
    spread = user.job_dir("spread")
    first, second = (spread / "attempts" / "1" / "run.env").read_text(), (
        spread / "attempts" / "1" / "node-1" / "run.env").read_text()
    log = (spread / "attempts" / "1" / "job.log").read_text()
    assert "--nnodes=2" in log and "--node-rank=0" in log and "--standalone" not in log, log[-2000:]
    assert "--node-rank=1" in (spread / "attempts" / "1" / "node-1" / "job.log").read_text()
    assert "GLOO_SOCKET_IFNAME=eth0" in first and "GLOO_SOCKET_IFNAME=eth0" in second, (first, second)
    # gpuq has the wrapper's verdict as the batch script ends; Slurm's own record may say RUNNING a moment more
    user.cluster.wait_job(user.slurm_id("spread"), {"COMPLETED"}, timeout=60)
    shown = user.cluster.show_job(user.slurm_id("spread"))
    assert shown["NumNodes"] == "2" and shown["JobState"] == "COMPLETED", shown
    hosts = {json.loads(p.read_text())["host"] for p in (spread / "attempts" / "1").glob("**/node.json")}
    assert hosts == set(user.cluster.nodes), hosts
    head = json.loads((spread / "attempts" / "1" / "node.json").read_text())["host"]
    told = user.history("spread")
    assert f"attempt 1 runs on 2 nodes: node 0 on {head}, node 1 on " in told, told  # which machine got which rank
    assert final_weights(user.job_dir("spread")) == final_weights(user.job_dir("packed"))


def test_one_node_of_a_two_node_job_killed_fails_the_attempt_and_both_resume(user: SlurmUser,
                                                                             tmp_path: Path) -> None:
    """kill -9 of node 1's whole group mid-run: srun ends node 0's part too (--kill-on-bad-exit), the
    attempt ends as a stop, and the job resumes on two nodes from the newest checkpoint to the weights
    of an uninterrupted twin."""
    user.add()
    queue = write_project(tmp_path, {"victim": tiny_config(0.05, 1024), "twin": tiny_config(0.0, 1024)},
                          ["configs/victim.yaml classify 2 name=victim nodes=2 gpus=1 retries=1",
                           "configs/twin.yaml classify 2 name=twin nodes=1 gpus=2"])
    code, text = user.gpuq("submit", str(queue))
    assert code == 0, text
    victim = user.job_dir("victim")
    assert wait_for(lambda: latest_step(victim) >= 2 * CKPT_EVERY, timeout=240, interval=0.2), user.logs()
    node = json.loads((victim / "attempts" / "1" / "node-1" / "node.json").read_text())
    pgid = json.loads((victim / "attempts" / "1" / "node-1" / "pgid").read_text())["pgid"]
    killed = user.cluster.ssh(user.cluster.host_index(node["host"]), f"kill -9 -{int(pgid)}")
    assert killed.returncode == 0, killed
    code, text = user.gpuq("wait", "--timeout", "400", timeout=500)
    assert code == 0, text + user.history("victim") + user.logs()[-6000:]
    jobs = user.jobs()
    assert jobs["victim"].state == "SUCCEEDED" and jobs["victim"].attempt_count == 2, user.history("victim")  # type: ignore[attr-defined]
    first = json.loads((victim / "attempts" / "1" / "exit.json").read_text())
    assert first["wrapper_code"] != 0, first
    log = (victim / "attempts" / "2" / "job.log").read_text()
    resumed = [line for line in log.splitlines() if "GPUQ_RESUMED" in line]
    assert resumed and int(resumed[0].split("step=")[1].split()[0]) >= 2 * CKPT_EVERY, log[-3000:]
    ranks = {json.loads(p.read_text())["rank"] for p in (victim / "attempts" / "2").glob("**/node.json")}
    assert ranks == {0, 1}
    assert final_weights(user.job_dir("victim")) == final_weights(user.job_dir("twin"))


def test_a_multi_node_job_without_a_slurm_host_is_refused_with_the_reason(user: SlurmUser, tmp_path: Path) -> None:
    queue = write_project(tmp_path, {"tiny": tiny_config()}, ["configs/tiny.yaml classify 1 name=wide nodes=2 gpus=1"])
    code, text = user.gpuq("submit", str(queue), "--host", "local")
    assert code != 0 and "needs 2 nodes with gpus=1 each: 2 SSH hosts with 1 slots each (0 usable), or a Slurm " \
        "host with 2 nodes" in text, text
    assert "nothing was submitted" in text, text
    assert not user.jobs()


def test_gpuq_running_on_the_login_node_registers_the_cluster_as_local(user: SlurmUser, tmp_path: Path) -> None:
    """`gpuq hosts add hpc --slurm local`: gpuq itself runs on the login node (here: over SSH into the
    login host, with this interpreter, which the host sees at its own path, and a copy of this
    checkout on the cluster's shared directory: the checkout may lie under a /tmp the host does not see)."""
    cluster = user.cluster
    home = cluster.shared_dir / f"home-{tmp_path.name[:30]}"
    project = cluster.shared_dir / f"project-{tmp_path.name[:30]}"
    source = cluster.shared_dir / f"gpuq-src-{tmp_path.name[:30]}"
    for part in ("orchestrator", "profiles", "payload"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "tiny.yaml").write_text(tiny_config())
    (project / "queue.txt").write_text("configs/tiny.yaml classify 1 name=here gpus=1\n")
    gpuq = f"cd {source} && GPUQ_HOME={home} GPUQ_HEARTBEAT_S=1 {sys.executable} -m orchestrator"
    added = cluster.ssh_login(f"{gpuq} hosts add hpc --slurm local --root {user.root} --profile rehearsal", timeout=200)
    assert added.returncode == 0, added.stdout + added.stderr
    assert "Slurm cluster via local" in added.stdout and "shared with the compute nodes: yes" in added.stdout, added
    # a variable of gpuq's own environment never reaches Slurm: slurmctld keeps each job's environment in
    # its state directory while the job lives (sbatch's default --export=ALL stored all of it there)
    probe = "leak-probe-5e1f"
    ran = cluster.ssh_login(f"export MY_TOKEN={probe}; {gpuq} submit {project / 'queue.txt'} && "
                            f"(grep -rl {probe} /run/gpuq-slurm/ctld || echo not-stored) && {gpuq} wait --timeout 200",
                            timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr + user.logs()
    assert "not-stored" in ran.stdout and "/run/gpuq-slurm" not in ran.stdout, ran.stdout
    ledger = Ledger(home / "ledger.db")
    try:
        (job,) = ledger.jobs()
        row = ledger.host("hpc")
    finally:
        ledger.close()
    assert job.state == "SUCCEEDED" and job.host == "hpc", job
    assert row is not None and row.kind == "slurm" and row.target == "local", row
    assert (user.job_dir("here") / "attempts" / "1" / "slurm.json").is_file()


def test_gpuq_cancel_reaches_scancel(user: SlurmUser, tmp_path: Path) -> None:
    user.add()
    queue = light_project(tmp_path, {"slow": light_config(steps=300, step_s=0.5)},
                          ["configs/slow.yaml classify 5 name=long gpus=1"])
    code, text = user.gpuq("submit", str(queue))
    assert code == 0, text
    assert wait_for(lambda: (user.job_dir("long") / "attempts" / "1" / "heartbeat").exists(), timeout=120)
    code, text = user.gpuq("cancel", "long")
    assert code == 0, text
    sid = user.slurm_id("long")
    ended = user.cluster.wait_job(sid, {"CANCELLED"}, timeout=60)
    assert ended.state == "CANCELLED"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        user.gpuq("status", "--once")
        if user.jobs()["long"].state == "CANCELLED":  # type: ignore[attr-defined]
            break
        time.sleep(1)
    assert user.jobs()["long"].state == "CANCELLED", user.logs()  # type: ignore[attr-defined]
