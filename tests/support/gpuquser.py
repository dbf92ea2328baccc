"""A gpuq user driving the CLI against a farm of namespace SSH hosts (tests/support/testhosts/).

Each user has its own GPUQ_HOME and its own data dir on the hosts, so tests sharing a module's farm
never see each other's files; ``stop_everything`` ends the user's agents and jobs by the process
groups they recorded (never by pattern).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.conftest import run_gpuq
from tests.support.testhosts import HostFarm


class User:
    """One gpuq user (GPUQ_HOME) and the data dir its hosts use."""

    def __init__(self, farm: HostFarm, home: Path, remote_root: str) -> None:
        self.farm = farm
        self.home = home
        self.remote_root = remote_root
        self.env = {"GPUQ_HOME": str(home), "GPUQ_HEARTBEAT_S": "1", "GPUQ_AGENT_IDLE_EXIT_S": "60"}

    def gpuq(self, *args: str, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return run_gpuq(*args, env=self.env, timeout=timeout, cwd=cwd)

    def add_hosts(self, count: int | None = None) -> list[str]:
        names = []
        for i, host in enumerate(self.farm.hosts[:count]):
            name = f"g{i}"
            added = self.gpuq("hosts", "add", name, f"root@{host.address}", "--key", str(self.farm.client_key),
                              "--profile", "rehearsal", "--root", self.remote_root, "--trust-new-host-key")
            assert added.returncode == 0, added.stdout + added.stderr
            names.append(name)
        return names

    def host_dir(self, i: int) -> Path:
        """Host i's data dir, seen from the controller's side of its mount namespace."""
        rel = self.remote_root.removeprefix("/root/")
        return self.farm.hosts[i].root_dir / "root" / rel

    def launches(self) -> dict[str, list[int]]:
        """job id -> farm hosts whose agent launched an attempt of it."""
        seen: dict[str, list[int]] = {}
        for i in range(len(self.farm.hosts)):
            for launch in self.host_dir(i).glob("jobs/*/attempts/*/launch.json"):
                seen.setdefault(launch.parents[2].name, []).append(i)
        return seen

    def logs_of_unfinished(self) -> str:
        """Tails of the logs of every job that did not succeed: what a failing assertion should show."""
        out = []
        for i in range(len(self.farm.hosts)):
            for exit_file in self.host_dir(i).glob("jobs/*/attempts/*/exit.json"):
                record = json.loads(exit_file.read_text())
                if record.get("wrapper_code") != 0:
                    log = exit_file.with_name("job.log")
                    tail = log.read_text(errors="replace")[-3000:] if log.is_file() else "(no log)"
                    out.append(f"--- host {i} {exit_file.parent}: {record}\n{tail}")
        return "\n".join(out)

    def status_doc(self) -> dict:
        out = self.gpuq("status", "--json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def stop_everything(self) -> None:
        """Stop this user's agents and jobs on every host, by their recorded groups."""
        farm = self.farm
        for i in range(len(farm.hosts)):  # stop this test's agents and jobs, by their recorded groups
            stop = [farm.hosts[i].name]
            for pid_file in [self.host_dir(i) / "agent.pid", *self.host_dir(i).glob("jobs/*/attempts/*/pgid")]:
                try:
                    rec = json.loads(pid_file.read_text())
                except (OSError, ValueError):
                    continue
                stop.append(str(rec.get("pgid") or rec.get("pid")))
            if len(stop) > 1 and farm.hosts[i].init_alive():
                farm.ssh(i, "sh", "-c", 'for g in "$@"; do kill -9 "-$g" 2>/dev/null; done; true', "sh", *stop[1:])
