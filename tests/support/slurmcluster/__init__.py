"""A real Slurm cluster on a routed farm of test hosts (tests/support/testhosts/); needs root,
``slurm-wlm`` and ``munge`` (Debian: ``apt-get install -y slurm-wlm munge``).

    farm = HostFarm(base, 3, gpus=2, routed=True).start()
    with SlurmCluster(farm, login=0, compute=(1, 2)) as cluster:
        job = cluster.sbatch("--gres=gpu:1", wrap="nvidia-smi -L > out.txt")
        cluster.wait_job(job, {"COMPLETED"})

- **shared filesystem**: ``shared_dir`` = ``/var/tmp/gpuq-slurm-<farm id>/`` (outside the per-host
  dirs, so every host and the test process see the same files): ``slurm.conf``, ``gres.conf``,
  ``munge.key`` (0400), ``log/`` (every daemon's log) and ``cluster.json`` (the daemons' pids).  The
  farm removes it at teardown too (``HostFarm.attach_dir``), also by ``scripts/testhosts.py down``.
- **munge**: one generated key; one ``munged --foreground --force`` per host, socket at the default
  ``/run/munge/munge.socket.2`` (/run is per host), seed and pid files there too.
- **slurmctld** on the login host, **slurmd** on each compute host (``NodeName`` = the host's name =
  its hostname, ``NodeAddr`` = its address); state and spool dirs in the host's private /run.  No
  cgroups (proctrack/linuxproc, task/none), no accounting (``sacct`` does not work), select/cons_tres
  with CR_CPU, GRES ``gpu:<gpus_per_node>`` over the host's fake /dev/nvidia0.. nodes (Slurm sets
  CUDA_VISIBLE_DEVICES).  Each host has its own network namespace, so the standard ports
  (6817/6818) never collide with a cluster of another pytest-xdist worker.
- **clients**: every host's sshd gets ``SetEnv SLURM_CONF=<shared_dir>/slurm.conf``, so ``sbatch``,
  ``squeue``, ``scancel``, ``sinfo``, ``scontrol`` run over SSH as plain commands find the cluster;
  /etc/slurm and /etc/munge are never written.

Timings (22.05, this config): start ~3.3 s (nodes idle after ~0.4 s, then the scheduler's first
pass); sbatch -> COMPLETED of a trivial job ~1 s; ``scontrol requeue`` -> running again ~6-7 s (a
requeued job is held PENDING/BeginTime for cred_expire+1 s: ``AuthInfo=cred_expire=5``, default 120);
a killed slurmd -> NODE_FAIL ~15-20 s.  Slurm's smallest time limit is 1 minute and slurmctld checks
limits every 30 s: ``scontrol update JobId=N EndTime=now`` on a running job gives TIMEOUT within 30 s.

Daemons are started inside a host's namespaces with ``nsenter`` (into its PID 1's mount, UTS, IPC,
network and PID namespaces), in the foreground; they are killed by recorded pid, checked against
its start time.  A host's PID 1 dying (``farm.preempt``, farm teardown) kills them too.

The package: ``cluster.py`` (``SlurmCluster``: names, start, teardown, faults, logs) over its bases
``commands.py`` (sbatch, squeue, scontrol, sinfo over SSH; ``Job``), ``config.py`` (slurm.conf, gres.conf,
the munge key) and ``daemons.py`` (the daemons' start and stop, by recorded pid).
"""
from __future__ import annotations

from tests.support.slurmcluster.cluster import SlurmCluster
from tests.support.slurmcluster.commands import ENDED_STATES, SQUEUE_FORMAT, Job
from tests.support.slurmcluster.daemons import (
    INSTALL_HINT,
    MUNGE_DIR,
    SBIN_PATH,
    SLURM_BINARIES,
    STATE_DIR,
    requirements_problem,
)

__all__ = ["ENDED_STATES", "INSTALL_HINT", "MUNGE_DIR", "SBIN_PATH", "SLURM_BINARIES", "SQUEUE_FORMAT", "STATE_DIR",
           "Job", "SlurmCluster", "requirements_problem"]
