"""SIGTERM within a grace window, and SIGKILL in the middle of a save (docs/checkpoints.md).

Real torchrun, 2 CPU processes, gloo.  The payload learns the grace (GPUQ_SIGTERM_GRACE_S),
measures its steps and saves, and at a step boundary every rank agrees to write a final checkpoint
only when it completes in time; otherwise the previous verified checkpoint stays the resume anchor.
Whatever happened, the resumed run must end with the weights of an uninterrupted run.

Saves and steps are made slow, or held for a SIGKILL, with the payload's TEST HOOKS
(GPUQ_TEST_HOOK_SAVE_PAUSE, GPUQ_TEST_HOOK_STEP_SLEEP_S); real jobs never set them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.jobspecs import spec_doc
from tests.support.once import once
from tests.support.proctree import assert_gone, descendants

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "payload" / "train.py"
EPOCHS = 4
STEPS_PER_EPOCH = 2048 // 2 // 16
CONFIG = """\
seed: 11
batch_size: 16
model: {{width: 64, depth: 2, dropout: 0.1}}
data: {{n_train: 2048, n_val: 256, n_features: 16, n_classes: 4, noise: 2.0}}
augment: {{noise_std: 0.2, feature_drop: 0.1}}
optim: {{lr: 0.05, momentum: 0.9, weight_decay: 0.0001}}
schedule: {{warmup_steps: 20, kind: cosine}}
ckpt_every_steps: {ckpt_every}
log_every_steps: 8
"""
RESUMED = re.compile(r"GPUQ_RESUMED step=(\d+) epoch=(\d+) sha256=([0-9a-f]{64})")
SAVED = re.compile(r"^checkpoint \((\w+)\) step=(\d+) .* sha256=([0-9a-f]{64}) bytes=\d+ save_s=([0-9.]+)$", re.M)

pytestmark = pytest.mark.integration


class Run:
    """One training directory and its log, across attempts."""

    def __init__(self, tmp: Path, ckpt_every: int) -> None:
        self.dir = tmp / "run"
        self.ckpt = self.dir / "ckpt"
        self.log = tmp / "log.txt"
        self.exit_file = tmp / "trainer_exit.json"
        self.config = tmp / "cfg.yaml"
        self.config.write_text(CONFIG.format(ckpt_every=ckpt_every))
        self.proc: subprocess.Popen | None = None
        self.offset = 0  # where the current attempt's log starts
        self.attempt = 0

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUQ_", "TORCH_ELASTIC_"))}
        env.update({
            "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            "GPUQ_CKPT_DIR": str(self.ckpt), "GPUQ_RESULT_DIR": str(self.dir / "result"),
            "GPUQ_HEARTBEAT": str(self.dir / "heartbeat"), "GPUQ_HEARTBEAT_S": "0.5",
            "GPUQ_CKPT_INTERVAL_S": "600", "GPUQ_JOB_ID": "c0123456789ab", "GPUQ_ATTEMPT": str(self.attempt),
            "GPUQ_EXIT_FILE": str(self.exit_file),
        })
        env.update(extra)
        return env

    def start(self, **env: str) -> subprocess.Popen:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.attempt += 1
        self.exit_file.unlink(missing_ok=True)
        self.offset = self.log.stat().st_size if self.log.exists() else 0
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
               str(TRAIN), "--config", str(self.config), "--task", "classify", "--epochs", str(EPOCHS)]
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                         env=self.env(**env), start_new_session=True)
        return self.proc

    def text(self) -> str:
        """This attempt's part of the log."""
        with open(self.log, "rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode("utf-8", "replace")

    def wait_for(self, what: str, pred: Callable[[], object], timeout: float = 45) -> object:
        deadline = time.monotonic() + timeout
        while True:
            got = pred()
            if got:
                return got
            assert self.proc is not None and self.proc.poll() is None, f"exited before {what}:\n{self.text()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{self.text()}"
            time.sleep(0.01)

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL torchrun and its workers at once (the workers live in sessions of their own)."""
        assert self.proc is not None
        victims = [self.proc.pid, *descendants(self.proc.pid)]
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        assert_gone(victims)

    def sigterm(self) -> float:
        assert self.proc is not None
        workers = descendants(self.proc.pid)
        t = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGTERM)  # what the wrapper relays; torchrun relays it on
        self.wait()
        assert_gone(workers)
        return time.monotonic() - t

    def pointer(self) -> dict | None:
        try:
            return json.loads((self.ckpt / "LATEST").read_text())
        except (OSError, ValueError):
            return None

    def exit_code(self) -> int | None:
        try:
            return json.loads(self.exit_file.read_text())["code"]
        except (OSError, ValueError, KeyError):
            return None

    def saves(self) -> list[tuple[str, int, str, float]]:
        return [(w, int(s), h, float(t)) for w, s, h, t in SAVED.findall(self.text())]

    def resume_to_the_end(self, reference: Path, anchor: dict) -> str:
        """Relaunch without hooks: it must resume from ``anchor`` and end bit-identical to the reference."""
        self.start()
        rc = self.wait()
        text = self.text()
        assert rc == 0, text
        m = RESUMED.search(text)
        assert m, text
        assert (int(m.group(1)), m.group(3)) == (anchor["step"], anchor["sha256"]), (m.group(0), anchor)
        assert _summary(self.dir)["weights_sha256"] == _summary(reference)["weights_sha256"]
        mine, ref = _final_model(self.dir), _final_model(reference)
        assert sorted(mine) == sorted(ref)
        for key in ref:
            assert torch.equal(mine[key], ref[key]), key
        assert not list(self.ckpt.glob("*.tmp"))
        assert [p.name for p in self.ckpt.glob("latest*.pt")] == [self.pointer()["file"]]
        return text


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "result" / "summary.json").read_text())


def _final_model(run_dir: Path) -> dict:
    pointer = json.loads((run_dir / "ckpt" / "LATEST").read_text())
    return torch.load(run_dir / "ckpt" / pointer["file"], map_location="cpu", weights_only=False)["model"]




@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run, once for the whole test run (tests/support/once.py); tests only read it."""
    return Path(once(tmp_path_factory, "test_payload_sigterm-reference", _reference))


def _reference(base: Path) -> str:
    run = Run(base, ckpt_every=0)
    run.start()
    rc = run.wait()
    assert rc == 0, run.text()
    assert _summary(run.dir)["steps"] == EPOCHS * STEPS_PER_EPOCH
    return str(run.dir)


def test_generous_grace_saves_at_the_boundary_after_the_signal(tmp_path: Path, reference: Path) -> None:
    """(a) Grace 30 s: the final checkpoint is written at the step boundary after the SIGTERM, beyond
    the last timer checkpoint; exit 143; the resume starts there and ends bit-identical."""
    run = Run(tmp_path, ckpt_every=0)
    # steps of >= 50 ms (test hook): two 0.4 s timer checkpoints take a few dozen of the 256 steps,
    # so the signal lands mid-training on any machine, however loaded
    run.start(GPUQ_SIGTERM_GRACE_S="30", GPUQ_CKPT_INTERVAL_S="0.4", GPUQ_TEST_HOOK_STEP_SLEEP_S="0.05")
    first = run.wait_for("a timer checkpoint", run.pointer)
    second = run.wait_for("a second timer checkpoint",
                          lambda: (p := run.pointer()) is not None and p["step"] != first["step"] and p)
    assert isinstance(second, dict)
    run.wait_for("a step after the second timer checkpoint",
                 lambda: f"TEST HOOK: step {second['step'] + 2} sleeping" in run.text())
    run.sigterm()
    text = run.text()
    assert run.exit_code() == 143, text
    saves = run.saves()
    periodic = [s for w, s, _, _ in saves if w == "periodic"]
    signal_saves = [(s, h) for w, s, h, _ in saves if w == "signal"]
    assert len(periodic) >= 2 and len(signal_saves) == 1, text
    step, sha = signal_saves[0]
    assert step > max(periodic), text  # beyond the last timer checkpoint
    assert step < EPOCHS * STEPS_PER_EPOCH, "training finished before the signal"
    m = re.search(rf"SIGTERM at step {step}: final checkpoint: ([0-9.]+) s since signal \+ save ([0-9.]+) s x 1.5"
                  rf" \+ margin 0.5 s = ([0-9.]+) s <= grace 30.00 s", text)
    assert m, text
    assert float(m.group(2)) > 0  # the measured save time (gather, write, fsync, pointer, barrier)
    pointer = run.pointer()
    assert (pointer["step"], pointer["sha256"]) == (step, sha)
    assert not list(run.ckpt.glob("*.tmp"))
    run.resume_to_the_end(reference, pointer)


def test_grace_too_short_for_a_save_skips_it_and_keeps_the_anchor(tmp_path: Path, reference: Path) -> None:
    """(b) Saves take >= 1.5 s (test hook) and the grace is 2 s: 1.5 x 1.5 + 0.5 > 2, so no final
    save; one log line says why, with the numbers; the resume starts from the last periodic save."""
    run = Run(tmp_path, ckpt_every=64)  # once an epoch
    run.start(GPUQ_SIGTERM_GRACE_S="2", GPUQ_TEST_HOOK_SAVE_PAUSE="write:1.5")
    run.wait_for("a periodic checkpoint", run.pointer)
    time.sleep(0.2)
    took = run.sigterm()
    text = run.text()
    assert run.exit_code() == 143, text
    assert took < 10, f"the exit took {took:.1f} s"
    saves = run.saves()
    assert saves and all(w == "periodic" for w, _, _, _ in saves), text
    assert min(t for _, _, _, t in saves) >= 1.5  # measured, the test hook included
    skipped = re.findall(r"^SIGTERM (?:at|in) step \d+: .*final checkpoint skipped: .*", text, re.M)
    assert len(skipped) == 1, text
    numbers = re.search(r"save ([0-9.]+) s.* = ([0-9.]+) s > grace 2.00 s; resume anchor stays step=(\d+)",
                        skipped[0])
    assert numbers, skipped[0]
    assert float(numbers.group(1)) >= 1.5 and float(numbers.group(2)) > 2.0
    pointer = run.pointer()
    last = saves[-1]
    assert (pointer["step"], pointer["sha256"]) == (last[1], last[2]) and int(numbers.group(3)) == last[1]
    run.resume_to_the_end(reference, pointer)


def test_sigkill_during_a_save_never_selects_the_torn_file(tmp_path: Path, reference: Path) -> None:
    """(c) SIGKILL while a save is held mid-way through the tmp write, after the rename but before the
    pointer, and with LATEST.tmp written: each restart resumes from the previous verified
    checkpoint, deletes the leftover *.tmp, and the final weights equal the uninterrupted run's."""
    run = Run(tmp_path, ckpt_every=16)
    anchor: dict | None = None
    leftover = None
    for point in ("write", "renamed", "pointer"):
        from_step = 40 if anchor is None else anchor["step"] + 1  # a verified checkpoint comes first
        run.start(GPUQ_TEST_HOOK_SAVE_PAUSE=f"{point}:60:{from_step}")
        if anchor is not None:
            m = run.wait_for("the resume", lambda: RESUMED.search(run.text()))
            assert (int(m.group(1)), m.group(3)) == (anchor["step"], anchor["sha256"]), run.text()
            if leftover:
                assert f"removed leftover {leftover} from" in run.text(), run.text()
                assert not (run.ckpt / leftover).exists()
        held = run.wait_for(f"a save held at {point}",
                            lambda p=point: re.search(rf"TEST HOOK: save paused at {p} file=(\S+)", run.text()))
        name = held.group(1)
        anchor = run.pointer()
        assert anchor is not None, run.text()
        if point == "write":  # a torn tmp file: part of a checkpoint
            assert name.endswith(".pt.tmp")
            with pytest.raises(Exception):  # noqa: B017 - any failure to load a torn file will do
                torch.load(run.ckpt / name, map_location="cpu", weights_only=False)
            held_step = int(name.split("-")[1].split(".")[0])
        elif point == "renamed":  # a complete file that LATEST does not name
            assert name.endswith(".pt") and (run.ckpt / name).is_file()
            held_step = int(name.split("-")[1].split(".")[0])
        else:  # the new pointer is written but not moved into place
            assert name == "LATEST.tmp"
            held_step = json.loads((run.ckpt / name).read_text())["step"]
        assert held_step > anchor["step"], (held_step, anchor)
        run.kill()
        assert run.pointer() == anchor
        leftover = name if name.endswith(".tmp") else None
        assert sorted(p.name for p in run.ckpt.glob("*.tmp")) == ([leftover] if leftover else [])
        if point == "renamed":  # complete, unpointed: must not be selected
            assert (run.ckpt / name).is_file() and name != anchor["file"]

    assert anchor is not None and leftover == "LATEST.tmp"
    text = run.resume_to_the_end(reference, anchor)
    assert "removed leftover LATEST.tmp from" in text, text


def test_long_steps_are_finished_or_abandoned_by_the_grace(tmp_path: Path, reference: Path) -> None:
    """Steps of >= 0.5 s (test hook).  Grace 30 s: the step in progress at the SIGTERM is finished and
    saved.  Grace 1 s: finishing it and saving cannot fit, so every rank abandons it unapplied before
    the backward pass and exits 143 without a save; the resume starts from the previous checkpoint."""
    run = Run(tmp_path, ckpt_every=0)
    first_step = 1
    anchor: dict | None = None
    for grace_s in ("30", "1"):
        run.start(GPUQ_SIGTERM_GRACE_S=grace_s, GPUQ_TEST_HOOK_STEP_SLEEP_S="0.5")

        def slow_step(after: int = first_step + 2) -> int | None:
            """A step being computed, once two have been measured (a boundary agreed on their time)."""
            steps = [int(n) for n in re.findall(r"^TEST HOOK: step (\d+) sleeping", run.text(), re.M)]
            return steps[-1] if steps and steps[-1] > after else None

        in_progress = run.wait_for("a slow step", slow_step)
        before = run.pointer()
        took = run.sigterm()  # lands in the step's 0.5 s sleep, after its forward pass
        text = run.text()
        assert run.exit_code() == 143, text
        if grace_s == "30":
            assert re.search(rf"^SIGTERM in step {in_progress}: finishing it", text, re.M), text
            assert [(w, s) for w, s, _, _ in run.saves()][-1] == ("signal", in_progress), text
            anchor = run.pointer()
            assert anchor is not None and anchor["step"] == in_progress
            first_step = in_progress + 1
        else:
            assert re.search(rf"^SIGTERM in step {in_progress}: step abandoned \(not applied\), final "
                             rf"checkpoint skipped: .* > grace 1.00 s", text, re.M), text
            assert "checkpoint (signal)" not in text and run.pointer() == before, text
            assert before is not None and before["step"] < in_progress
            assert took < 10, f"the exit took {took:.1f} s"
            anchor = before
    assert anchor is not None
    run.resume_to_the_end(reference, anchor)


def test_wrapper_passes_the_grace_to_the_trainer(tmp_path: Path) -> None:
    """The wrapper's run.env: GPUQ_SIGTERM_GRACE_S = spec sigterm_grace_s (a spot grace) capped by
    kill_grace_s, default kill_grace_s; torchrun never kills before kill_grace_s."""
    sys.path.insert(0, str(REPO / "payload" / "agent"))
    from gpuq_attempt import gpuq_wrap
    from gpuq_base.gpuq_files import Layout
    from gpuq_base.gpuq_jobspec import parse_spec

    cases = [  # extra spec fields, GPUQ_SIGTERM_GRACE_S, TORCH_ELASTIC_SHUTDOWN_TIMEOUT
        ({}, "30", "30"),
        ({"kill_grace_s": 45}, "45", "45"),
        ({"kill_grace_s": 45, "sigterm_grace_s": 5}, "5", "45"),  # a spot grace shorter than the cancel's
        ({"kill_grace_s": 10, "sigterm_grace_s": 60}, "10", "30"),  # the wrapper kills at 10 s anyway
        ({"kill_grace_s": 0}, "0", "30"),
        ({"kill_grace_s": 2.5, "sigterm_grace_s": None}, "2.5", "30"),
    ]
    for extra, want, shutdown in cases:
        spec = parse_spec(spec_doc(**{"job_id": "c0123456789ab", "task": "classify", "epochs": 1,
                                      "bundle_sha": "f" * 64, "kill_grace_s": 30, **extra}))
        env = gpuq_wrap.Wrapper(Layout(str(tmp_path)), "c0123456789ab", 1).build_env(spec, {"kind": "cpu"})
        assert env["GPUQ_SIGTERM_GRACE_S"] == want, extra
        assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == shutdown, extra
