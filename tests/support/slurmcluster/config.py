"""What a cluster's shared dir holds (slurm.conf, gres.conf, cgroup.conf, munge.key) and SLURM_CONF in
every host's sshd_config."""

from __future__ import annotations

import os
import shlex
import shutil

from tests.support.slurmcluster.daemons import STATE_DIR
from tests.support.testhosts import _atomic_write


class SlurmConfig:
    """``SlurmCluster``'s configuration, written before any daemon starts."""

    def _prepare(self) -> None:
        if self.shared_dir.exists():  # a dead farm's with the same id: farm ids are unique among live farms
            shutil.rmtree(self.shared_dir)
        self.shared_dir.mkdir(mode=0o755, parents=True)
        self.shared_dir.chmod(0o755)
        self.farm.attach_dir(self.shared_dir)
        self.log_dir.mkdir(mode=0o755)
        fd = os.open(self.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        for i in (self.login, *self.compute):
            run = self.farm.hosts[i].run_dir
            for sub in ("munge", "gpuq-slurm", "gpuq-slurm/ctld", "gpuq-slurm/spool"):
                (run / sub).mkdir(mode=0o755, exist_ok=True)
                (run / sub).chmod(0o755)
        _atomic_write(self.conf, self._slurm_conf())
        _atomic_write(self.shared_dir / "gres.conf", self._gres_conf())
        # slurmd 22.05 always loads a cgroup plugin; v1's does nothing until a cgroup plugin (proctrack,
        # task, jobacct) uses it, and none does here.  (autodetect fails where /sys/fs/cgroup is odd.)
        _atomic_write(self.shared_dir / "cgroup.conf", "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
        for i in (self.login, *self.compute):
            h = self.farm.hosts[i]
            extra = _with_setenv(h.sshd_extra, "SLURM_CONF", str(self.conf))
            if extra != h.sshd_extra:
                self.farm.set_sshd_extra(i, extra)

    def _slurm_conf(self) -> str:
        login = self.farm.hosts[self.login]
        lines = [
            f"# gpuq test cluster on farm {self.farm.farm_id} (tests/support/slurmcluster/)",
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={login.name}({login.address})",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "AuthInfo=cred_expire=5",
            "CredType=cred/munge",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "MailProg=/bin/true",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "SchedulerParameters=sched_interval=1",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            f"StateSaveLocation={STATE_DIR}/ctld",
            f"SlurmdSpoolDir={STATE_DIR}/spool",
            f"SlurmctldPidFile={STATE_DIR}/slurmctld.pid",
            f"SlurmdPidFile={STATE_DIR}/slurmd.pid",
            f"SlurmctldLogFile={self.log_dir}/slurmctld-{login.name}.log",
            f"SlurmdLogFile={self.log_dir}/slurmd-%n.log",
            f"SlurmctldDebug={self.debug}",
            f"SlurmdDebug={self.debug}",
            "JobRequeue=1",
            f"MinJobAge={self.min_job_age}",
            "SlurmdTimeout=10",
            "SlurmctldTimeout=10",
            "ReturnToService=2",
            "KillWait=20",  # Slurm defaults to 30: a wrapper under load gets time to write its exit record
            "MessageTimeout=3",
            "TCPTimeout=2",
            "BatchStartTimeout=10",
            "InactiveLimit=0",
            "Waittime=0",
            "CompleteWait=0",
        ]
        for i in self.compute:
            h = self.farm.hosts[i]
            gres = f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else ""
            lines.append(f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} CPUs={self.cpus_per_node}"
                         f" Sockets=1 CoresPerSocket={self.cpus_per_node} ThreadsPerCore=1 RealMemory=1024{gres}"
                         " State=UNKNOWN")
        lines.append(f"PartitionName=gpu Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _gres_conf(self) -> str:
        lines = ["AutoDetect=off"]
        if self.gpus_per_node:
            last = self.gpus_per_node - 1
            files = "/dev/nvidia0" if last == 0 else f"/dev/nvidia[0-{last}]"
            lines += [f"NodeName={self.farm.hosts[i].name} Name=gpu File={files}" for i in self.compute]
        return "\n".join(lines) + "\n"


def _with_setenv(extra: str, name: str, value: str) -> str:
    """sshd_config lines ``extra`` with ``name=value`` in its SetEnv line (sshd uses the first SetEnv
    line only), replacing an earlier value of ``name``."""
    lines = extra.splitlines()
    item = f"{name}={value}"
    for k, line in enumerate(lines):
        words = shlex.split(line)
        if words and words[0].lower() == "setenv":
            kept = [w for w in words[1:] if not w.startswith(f"{name}=")]
            lines[k] = shlex.join(["SetEnv", *kept, item])
            return "\n".join(lines) + "\n"
    return "\n".join([*lines, shlex.join(["SetEnv", item])]) + "\n"
