"""The live `gpuq status` dashboard in a real terminal: a detached tmux session of a fixed size runs it
against a real running job on the local host; the test reads the screen a person would see, presses
keys, and checks the process ends and leaves the terminal as it found it."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import ROOT, run_gpuq, wait_for
from tests.support.lightproject import light_config, light_project

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tmux") is None,
                       reason="tmux is not installed (.ci/run installs it; `apt-get install -y tmux` here)"),
]

WIDTH, HEIGHT = 160, 48
ENV = {"GPUQ_LOCAL_CPU_SLOTS": "2", "GPUQ_HEARTBEAT_S": "1"}


class Pane:
    """One detached tmux session on a private server socket (the user's own tmux is never touched)."""

    def __init__(self, name: str = "") -> None:  # a server of its own per name: a new size is never an old one's
        self.socket = f"gpuq-test-{os.getpid()}{name}"
        self.session = f"gpuq-dashboard-{os.getpid()}{name}"
        # the size is the terminal's: a COLUMNS or LINES some other test of this worker left (Rich reads them
        # before the terminal) would draw a 120x40 pane at their size
        self.env = {**{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")},
                    "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-u", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True,
                              text=True, env=self.env, timeout=30, check=False)

    def start(self, script: Path, width: int = WIDTH, height: int = HEIGHT) -> None:
        started = self.tmux("new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height),
                            f"bash --noprofile --norc {shlex.quote(str(script))}")
        assert started.returncode == 0, started.stderr

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session).stdout

    def keys(self, *keys: str) -> None:
        assert self.tmux("send-keys", "-t", self.session, *keys).returncode == 0

    def shell_pid(self) -> int:
        return int(self.tmux("list-panes", "-t", self.session, "-F", "#{pane_pid}").stdout.split()[0])

    def kill(self) -> None:
        self.tmux("kill-session", "-t", self.session)


def _dashboard_up(pane: Pane) -> bool:
    """The live view is drawn and has finished at least one probe of every host."""
    screen = pane.screen()
    return "╭─ hosts" in screen and "dashjob" in screen and "RUNNING" in screen and "updated " in screen


def _child_of(pid: int) -> int:
    """The process the pane's shell is waiting for (the running `gpuq status`)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                return int(entry.name)
    raise AssertionError(f"no child of {pid}")


def test_live_dashboard_in_a_real_terminal(gpuq_home: Path, tmp_path: Path) -> None:
    # the light stdlib trainer (tests/support/lightproject.py) beats like the payload, sleeping between
    # steps: the dashboard is under test, and two ranks training all along would only load the machine
    queue = light_project(tmp_path, {"slow": light_config(steps=600, step_s=0.5)},
                          ["configs/slow.yaml classify 200 gpus=2 name=dashjob"])
    submitted = run_gpuq("submit", str(queue), env=ENV)
    assert submitted.returncode == 0, submitted.stderr

    schema = json.loads((ROOT / "docs" / "schemas" / "status.schema.json").read_text())
    docs: list[dict[str, object]] = []

    def running_with_a_step() -> bool:
        result = run_gpuq("status", "--json", env=ENV)
        assert result.returncode == 0, result.stderr
        docs.append(json.loads(result.stdout))
        return any(j["state"] == "RUNNING" and j["step"] for j in docs[-1]["jobs"])  # type: ignore[attr-defined]

    assert wait_for(running_with_a_step, timeout=180, interval=1.0), docs[-1:]
    jsonschema.Draft202012Validator(schema).validate(docs[-1])  # the real --json output keeps its promise

    # not a terminal: one snapshot, the table with the new columns
    once = run_gpuq("status", env=ENV)
    assert once.returncode == 0 and "host:gpu" in once.stdout and "dashjob" in once.stdout, once.stderr
    assert "\x1b[?1049h" not in once.stdout  # never the alternate screen on a pipe

    gpuq = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "orchestrator", "status", "--interval", "1"])
    script = tmp_path / "session.sh"
    script.write_text("\n".join([
        f"cd {shlex.quote(str(ROOT))}",
        *[f"export {k}={shlex.quote(v)}" for k, v in {**ENV, "GPUQ_HOME": str(gpuq_home)}.items()],
        "PS1='$ '",
        f"stty -g > {tmp_path}/stty.before",
        gpuq, f'code=$?; echo "gpuq-exit=$code"; echo $code > {tmp_path}/exit.1',
        f"stty -g > {tmp_path}/stty.1.tmp && mv {tmp_path}/stty.1.tmp {tmp_path}/stty.1",  # whole when it appears
        gpuq, f'code=$?; echo "gpuq-exit=$code"; echo $code > {tmp_path}/exit.2',
        f"stty -g > {tmp_path}/stty.2.tmp && mv {tmp_path}/stty.2.tmp {tmp_path}/stty.2",  # whole when it appears
        "exec sleep 600",
    ]) + "\n")
    pane = Pane()
    try:
        pane.start(script)
        assert wait_for(lambda: _dashboard_up(pane), timeout=120, interval=0.5), pane.screen()
        lines = pane.screen().splitlines()
        assert len(lines) == HEIGHT and max(len(line) for line in lines) <= WIDTH
        for title in ("hosts", "jobs", "alerts"):
            assert any(line.startswith(f"╭─ {title}") for line in lines), (title, lines)
        host = next(line for line in lines if line.startswith("│ local "))
        assert " ok" in host and "cpu free" in host and "%" in host, host
        assert "cpu 0,1" in host and "dashjob" in host, host  # the CPU slots the job holds
        job = next(line for line in lines if "dashjob" in line and "RUNNING" in line)
        assert "local:0,1" in job and ("█" in job or "░" in job) and "%" in job and "ep " in job, job
        assert "q quit" in lines[-1] and "every 1s" in lines[-1], lines[-1]

        pane.keys("Down", "j", "Up", "k", "PageDown", "r")  # scrolling one job is a no-op, never a crash
        assert wait_for(lambda: "dashjob" in pane.screen(), timeout=10), pane.screen()
        pane.keys("q")
        assert wait_for(lambda: (tmp_path / "stty.1").is_file(), timeout=30), pane.screen()
        assert (tmp_path / "exit.1").read_text().strip() == "0"
        # the terminal is back as it was: line editing and echo restored, the alternate screen left
        assert (tmp_path / "stty.1").read_text() == (tmp_path / "stty.before").read_text()

        # the second run ends by SIGTERM (a closed laptop lid, a `kill`): the terminal is restored too
        assert wait_for(lambda: _dashboard_up(pane), timeout=120, interval=0.5), pane.screen()
        os.kill(_child_of(pane.shell_pid()), signal.SIGTERM)
        assert wait_for(lambda: (tmp_path / "stty.2").is_file(), timeout=30), pane.screen()
        assert (tmp_path / "exit.2").read_text().strip() == str(128 + signal.SIGTERM)
        assert (tmp_path / "stty.2").read_text() == (tmp_path / "stty.before").read_text()
        after = pane.screen()
        assert "gpuq-exit=0" in after and f"gpuq-exit={128 + signal.SIGTERM}" in after
        assert "╭─ hosts" not in after and "Traceback" not in after, after
    finally:
        pane.kill()


def _job_rows(screen: str) -> list[str]:
    return [line for line in screen.splitlines() if line.startswith("│ ") and " baseline-seed" in line
            and "sweep_done" not in line]


def _fits(screen: str, width: int, height: int) -> bool:
    """The view is drawn at this size: four job rows, panels as wide as the terminal, the footer last."""
    lines = screen.rstrip("\n ").splitlines()  # (a resized tmux window may leave a blank last row)
    return (len(_job_rows(screen)) == 4 and height - 1 <= len(lines) <= height
            and max(len(line) for line in lines) == width and lines[-1].startswith("gpuq status · "))


def test_at_80x24_and_120x40_every_job_shows_its_whole_name_and_its_sweep(gpuq_home: Path, tmp_path: Path) -> None:
    # two sweeps of the same two seeds, finished (the light trainer, two short steps): `--all` lists four
    # rows whose names repeat; only the sweep column tells them apart
    for i in (1, 2):
        queue = light_project(tmp_path / f"p{i}", {"tiny": light_config(steps=2, step_s=0.05)},
                              ["configs/tiny.yaml classify 1 name=baseline seeds=2"])
        assert run_gpuq("submit", str(queue), env=ENV).returncode == 0
        waited = run_gpuq("wait", env=ENV)
        assert waited.returncode == 0, waited.stdout + waited.stderr
    listed = run_gpuq("status", "--all", "--json", "--no-probe", env=ENV)
    jobs = json.loads(listed.stdout)["jobs"]
    assert len(jobs) == 4 and len({j["sweep_id"] for j in jobs}) == 2 and len({j["name"] for j in jobs}) == 2, jobs

    gpuq = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "orchestrator", "status", "--all", "--no-probe",
                                              "--interval", "1"])
    script = tmp_path / "session.sh"
    script.write_text("\n".join([
        f"cd {shlex.quote(str(ROOT))}", "unset COLUMNS LINES",
        *[f"export {k}={shlex.quote(v)}" for k, v in {**ENV, "GPUQ_HOME": str(gpuq_home)}.items()],
        gpuq, f"echo $? > {tmp_path}/exit", "exec sleep 600",
    ]) + "\n")
    # each size in a tmux server of its own (a second session of one server may draw at the first's size)
    for width, height in ((80, 24), (120, 40)):
        (tmp_path / "exit").unlink(missing_ok=True)
        pane = Pane(f"-{width}x{height}")
        try:
            pane.start(script, width, height)
            assert wait_for(lambda size=(width, height), p=pane: _fits(p.screen(), *size), timeout=60, interval=0.5), \
                pane.screen()
            lines = pane.screen().rstrip("\n ").splitlines()
            rows = _job_rows(pane.screen())
            for job in jobs:  # the whole name, beside its own sweep, on one row
                assert any(f" {job['name']} " in row and job["sweep_id"] in row for row in rows), (job, rows)
            assert not any("…" in row for row in rows), rows
            footer = lines[-1]
            assert footer.startswith("gpuq status · ") and "every 1s" in footer and "q quit" in footer, "\n".join(lines)
            if width >= 120:  # room for (a prefix of) each job's id too
                assert all(any(job["id"][:8] in row for row in rows) for job in jobs), rows
            pane.keys("q")
            assert wait_for(lambda: (tmp_path / "exit").is_file(), timeout=30), pane.screen()
            assert (tmp_path / "exit").read_text().strip() == "0"
        finally:
            pane.kill()
