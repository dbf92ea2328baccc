"""A user's project whose trainer is stdlib Python: no torch, no torchrun.

For the tests of *where* and *how often* jobs run (placement, work stealing, exactly-once, revival),
where the training itself is not what is tested.  Each torchrun job costs about 3 s of CPU in
interpreter start-up alone (the launcher and every rank import torch), which on the 2-core CI machine
is most of such a test's cost.  The payload's own behaviour (resume to identical weights, SIGTERM
saves, gloo worlds) and the real frameworks' conventions are tested with the real thing elsewhere.

The trainer keeps the payload's contract with the agent (docs/your-project.md): it beats its
heartbeat every step, writes ``result/metrics.jsonl`` with a final eval line, and exits 0.  Its
config file says how long it trains: ``steps: N`` and ``step_s: S`` (seconds per step).

``sleeper_project`` is lighter still: a trainer that only sleeps for the seconds its line gives and
writes nothing (a project with no heartbeat and no metrics, as many are).
"""

from __future__ import annotations

from pathlib import Path

TRAIN = '''\
import argparse, json, os, time
ap = argparse.ArgumentParser()
ap.add_argument("--config"); ap.add_argument("--task"); ap.add_argument("--epochs", type=int, default=1)
args, _ = ap.parse_known_args()
cfg = dict(line.split(":", 1) for line in open(args.config).read().splitlines() if ":" in line)
steps, step_s = int(cfg.get("steps", "4")), float(cfg.get("step_s", "0.5"))
result = os.environ["GPUQ_RESULT_DIR"]
os.makedirs(result, exist_ok=True)

def beat(step, phase="train"):
    tmp = os.environ["GPUQ_HEARTBEAT"] + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"time": time.time(), "step": step, "total_steps": steps, "epoch": 1, "epochs": 1,
                   "loss": 1.0 / (step + 1), "lr": 0.1, "phase": phase, "steps_per_s": 1.0 / max(step_s, 0.01)}, fh)
    os.replace(tmp, os.environ["GPUQ_HEARTBEAT"])

print("job", os.environ.get("GPUQ_JOB_ID"), "attempt", os.environ.get("GPUQ_ATTEMPT"), flush=True)
for step in range(1, steps + 1):
    beat(step)
    time.sleep(step_s)
with open(os.path.join(result, "metrics.jsonl"), "a") as fh:
    fh.write(json.dumps({"kind": "eval", "step": steps, "epoch": 1, "val_loss": 0.1, "val_acc": 0.9,
                         "time": time.time()}) + "\\n")
beat(steps, phase="done")
'''
TOML = ('[run]\ncommand = "train.py --config {config} --task {task} --epochs {epochs}"\nlauncher = "python"\n'
        'verify = ["metrics"]\n')


def light_config(steps: int = 4, step_s: float = 0.5) -> str:
    """A config for the light trainer: ``steps`` steps of ``step_s`` seconds each."""
    return f"steps: {steps}\nstep_s: {step_s}\n"


def light_project(base: Path, configs: dict[str, str], lines: list[str]) -> Path:
    """``base/project`` with the light trainer, ``configs/<name>.yaml`` and ``queue.txt`` (returned)."""
    work = base / "project"
    (work / "configs").mkdir(parents=True, exist_ok=True)
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    for name, text in configs.items():
        (work / "configs" / f"{name}.yaml").write_text(text)
    (work / "queue.txt").write_text("\n".join(lines) + "\n")
    return work / "queue.txt"


def sleeper_project(work: Path, line: str) -> Path:
    """``work`` with a trainer that only sleeps (seconds from the line) and one queue line (returned)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "sleeper.py").write_text("import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('slept', flush=True)\n")
    (work / "gpuq.toml").write_text('[run]\ncommand = "sleeper.py {args}"\nlauncher = "python"\n')
    (work / "queue.txt").write_text(line + "\n")
    return work / "queue.txt"
