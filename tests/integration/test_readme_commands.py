"""The README's commands do what it says (issue 39, "Done when"): every command line of its tour ("A
30-second tour") and of its "Settings" section runs, in the tour's order, against ONE real local sweep,
and gives the exit code and the output the README states; the defaults the Settings section names
are the settings' own; the tour's sample output has the shapes gpuq prints.

The sweep is the cheapest honest stand-in for ``payload/queue.txt``: the same two cells the README
names (``baseline`` and ``wide``, ``seeds=2`` each, as the example queue has them) of a stdlib trainer
(a [run] project: metrics.csv, a checkpoint it resumes from), not the torch example; ``payload/queue.txt``
in a command is that queue's path, ``q4mzk2a`` its sweep id.  The cancel runs when the sweep has ended
(it must say each job has already succeeded, not fail), so the other commands see every job succeed;
``scripts/bench_stopping.py`` runs with fewer simulated sweeps (``--sweeps``).  A README command this
test does not know fails it: a new line in the tour needs its expectation here.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.core.config import Settings
from tests.conftest import ROOT, run_gpuq

pytestmark = pytest.mark.integration

README = (ROOT / "README.md").read_text()

TRAIN = """import argparse, json, os, time
p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--width", type=float, default=1.0)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--resume", default="")
p.add_argument("--sleep", type=float, default=0.3)
p.add_argument("--weights", default="")
a = p.parse_args()
if a.weights:  # the evaluation of the README's chain: the checkpoint train handed over
    print("weights from epoch %d" % json.load(open(a.weights))["epoch"], flush=True)
start = json.load(open(a.resume))["epoch"] if a.resume else 0
new = not os.path.exists("metrics.csv")
for epoch in range(start, a.epochs):
    time.sleep(a.sleep)
    acc = 0.5 + 0.2 * a.width * (epoch + 1) / a.epochs + 0.01 * a.seed
    with open("metrics.csv", "a") as f:
        f.write(("epoch,step,train_loss,val_acc\\n" if new else "") + "%d,%d,%f,%f\\n" % (
            epoch, 10 * (epoch + 1), 1.0 / (epoch + 1), acc))
    new = False
    with open("ckpt.json.tmp", "w") as f:
        json.dump({"epoch": epoch + 1}, f)
    os.replace("ckpt.json.tmp", "ckpt.json")
    print("epoch %d/%d val_acc %.3f" % (epoch + 1, a.epochs, acc), flush=True)
"""
TOML = """[run]
command = "train.py {args}"
launcher = "python"
checkpoint = "ckpt.json"
resume_args = "--resume {checkpoint}"
metrics = "metrics.csv"
metric = "val_acc"
mode = "max"
smoke_args = "--sleep 0.05"
"""
QUEUE = ("name=baseline seeds=2 -- --epochs 3 --width 1.0 --seed {seed}\n"
         "name=wide seeds=2 -- --epochs 3 --width 1.5 --seed {seed}\n")
CHAIN = ("name=train -- --epochs 2 --sleep 0.05\n"  # the README's chain.txt: eval runs on train's checkpoint
         "name=eval after=train -- --epochs 1 --sleep 0.05 --weights {checkpoint.train}\n")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else len(README)]


def tour() -> list[str]:
    """The tour's command lines (``$ `` lines of its console block), comments cut."""
    block = _section("A 30-second tour").split("```console", 1)[1].split("```", 1)[0]
    return [re.split(r"\s{2,}#", ln[2:], maxsplit=1)[0].strip() for ln in block.splitlines() if ln.startswith("$ ")]


def settings_commands() -> list[str]:
    """The command lines the Settings section shows in backticks (those that run gpuq)."""
    return [c for c in re.findall(r"`([^`]+)`", _section("Settings")) if re.match(r"(GPUQ_\w+=\S+ )*gpuq ", c)]


def stated_defaults() -> dict[str, str]:
    """``key (value`` pairs of the Settings section: the default it states for each key."""
    text = " ".join(_section("Settings").split())
    found = re.findall(r"`(\w+)` \(`?([\w.]+)`?[;:)]", text)
    return {k: v for k, v in found if v != "default"}  # "(default: CPU count; ...)" is words, not a value


def test_the_settings_section_states_the_settings_own_defaults() -> None:
    stated = stated_defaults()
    assert len(stated) >= 25, stated
    defaults = Settings()
    for key, value in stated.items():
        assert key in Settings.model_fields, f"README names a setting gpuq does not have: {key}"
        actual = getattr(defaults, key)
        shown = str(actual).lower() if isinstance(actual, bool) else str(actual)
        if isinstance(actual, (int, float)) and not isinstance(actual, bool):
            assert float(value) == float(actual), (key, value, actual)
        else:
            assert value == shown, (key, value, actual)


def _sample_ids_have_gpuqs_shapes() -> None:
    sample = _section("A 30-second tour").split("```console", 1)[1].split("```", 1)[0].splitlines()
    assert re.fullmatch(r"sweep q[a-z0-9]{6}: \d+ jobs from \S+ \(bundle [0-9a-f]{12}\)", sample[2]), sample[2]
    assert re.match(r"  c[0-9a-f]{12}  \S+", sample[3]), sample[3]  # a job id: c + 12 hex


Check = Callable[[subprocess.CompletedProcess[str]], None]


def _contains(*words: str) -> Check:
    def check(done: subprocess.CompletedProcess[str]) -> None:
        for word in words:
            assert word in done.stdout, (word, done.stdout[-3000:])
    return check


def _status_json(done: subprocess.CompletedProcess[str]) -> None:
    doc = json.loads(done.stdout)
    assert doc["schema"] == "gpuq.cli.status/1" and len(doc["jobs"]) == 4 and doc["hosts"][0]["name"] == "local"


def _results_csv(done: subprocess.CompletedProcess[str]) -> None:
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert len(rows) == 4 and all(r["state"] == "SUCCEEDED" for r in rows), done.stdout
    assert all(float(r["best_val_acc"]) >= float(r["final_val_acc"]) > 0 for r in rows), done.stdout


# what each README command must do, keyed by its line (after the substitutions): exit code and a check
EXPECTED: dict[str, tuple[int, Check]] = {
    "gpuq submit Q": (0, _contains("4 jobs from")),
    "gpuq status --once": (0, _contains("hosts", "jobs", "local")),
    "gpuq status --all": (0, _contains("baseline-seed0", "wide-seed1")),
    "gpuq status --json": (0, _status_json),
    "gpuq status --no-probe --state RUNNING,FAILED": (0, _contains("jobs")),
    "gpuq logs baseline-seed0 -f": (0, _contains("epoch 3/3")),  # -f ends with the job
    "gpuq wait": (0, _contains("SUCCEEDED")),
    "gpuq results --csv": (0, _results_csv),
    "gpuq submit Q --dry-run": (0, _contains("dry run: 4 jobs valid", "nothing was written")),
    "gpuq submit Q --smoke": (0, _contains("2 of 2 cell(s) passed")),
    "gpuq pull": (0, _contains("4 of 4 jobs verified")),
    "gpuq submit Q (again)": (0, _contains("nothing to start: 4 of 4 jobs reused")),
    # the tour's queue has no line added since: every job is already in the sweep, nothing joins, exit 0
    "gpuq submit Q --into q4mzk2a": (0, _contains("nothing joined: every job of")),
    'eval "$(gpuq completion bash)"': (0, lambda done: None),
    "gpuq report": (0, _contains("baseline", "wide", "verdict")),
    "gpuq report --format html -o report/": (0, _contains("report.html")),
    "python scripts/bench_stopping.py": (0, lambda done: None),
    # the same queue again, with early stopping: every job is already run and pulled, so the cache answers
    "gpuq submit q.txt --stop baseline": (0, _contains("4 of 4 jobs reused")),
    "gpuq cancel baseline-seed0 wide-seed1": (0, _contains("baseline-seed0", "already SUCCEEDED")),
    "GPUQ_LOCAL_CPU_SLOTS=4 gpuq submit queue.txt": (0, _contains("nothing to start: 4 of 4 jobs reused")),
    "gpuq submit chain.txt --dry-run": (0, _contains("train → eval", "nothing was written")),
    "gpuq submit chain.txt": (0, _contains("2 jobs from")),  # a sweep of its own: run last, then waited for
    "gpuq hosts stop-agent HOST": (0, lambda done: None),  # HOST: local, whose agent is idle by then
}
# run when the sweep has ended (the module docstring), in this order
LAST = ("gpuq cancel baseline-seed0 wide-seed1", "gpuq submit chain.txt --dry-run", "gpuq submit chain.txt",
        "gpuq hosts stop-agent HOST")


def _run(line: str, queue: Path, sweep: str, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    line = line.replace("payload/queue.txt", str(queue)).replace("q4mzk2a", sweep)
    if line.startswith("eval "):  # a shell line: gpuq as this checkout's CLI
        shell = f'gpuq() {{ {shlex.quote(sys.executable)} -m orchestrator "$@"; }}; {line}; complete -p gpuq'
        return subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **env}, cwd=ROOT)
    if line.startswith("python "):
        argv = [sys.executable, *shlex.split(line)[1:], "--sweeps", "300", "--worse-sweeps", "100"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    words = shlex.split(line)
    extra = dict(w.split("=", 1) for w in words if re.fullmatch(r"GPUQ_\w+=\S*", w))
    args = [w for w in words if w not in {f"{k}={v}" for k, v in extra.items()}][1:]
    swap = {"queue.txt": str(queue), "q.txt": str(queue), "chain.txt": str(queue.parent / "chain.txt"),
            "report/": str(tmp_path / "report"), "HOST": "local"}
    args = [swap.get(a, a) for a in args]
    return run_gpuq(*args, env={**env, **extra}, timeout=300, cwd=tmp_path)


def test_every_tour_and_settings_command_runs_as_the_readme_says(gpuq_home: Path, tmp_path: Path) -> None:
    _sample_ids_have_gpuqs_shapes()
    work = tmp_path / "project"
    work.mkdir()
    (work / "train.py").write_text(TRAIN)
    (work / "gpuq.toml").write_text(TOML)
    (work / "queue.txt").write_text(QUEUE)
    (work / "chain.txt").write_text(CHAIN)
    queue = work / "queue.txt"
    env = {"GPUQ_HOME": str(gpuq_home), "GPUQ_PREFLIGHT": "false", "GPUQ_LOCAL_CPU_SLOTS": "4",
           "GPUQ_HEARTBEAT_S": "1", "COLUMNS": "160"}
    commands: list[tuple[str, str]] = []  # (its key in EXPECTED, the README's line)
    for line in tour():
        key = line.replace("payload/queue.txt", "Q")
        if key == "gpuq submit Q" and any(k == key for k, _ in commands):  # the tour's repeat
            key += " (again)"
        commands.append((key, line))
    commands += [(c, c) for c in settings_commands()]
    unknown = [key for key, _ in commands if key not in EXPECTED]
    assert not unknown, f"README commands this test does not check: {unknown}"
    order = [c for c in commands if c[0] not in LAST] + sorted((c for c in commands if c[0] in LAST),
                                                               key=lambda c: LAST.index(c[0]))
    sweep = ""
    for key, line in order:
        done = _run(line, queue, sweep, tmp_path, env)
        code, check = EXPECTED[key]
        assert done.returncode == code, (line, done.returncode, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (line, done.stderr)
        check(done)
        if not sweep and key == "gpuq submit Q":
            sweep = done.stdout.split("sweep ", 1)[1].split(":", 1)[0]
        if key == "gpuq submit chain.txt":  # eval ran after train, on the checkpoint train wrote
            assert run_gpuq("wait", env=env, timeout=300, cwd=tmp_path).returncode == 0
            states = {j["name"]: j["state"] for j in json.loads(run_gpuq("status", "--json", env=env).stdout)["jobs"]}
            assert states == {"train": "SUCCEEDED", "eval": "SUCCEEDED"}, states
            logs = run_gpuq("logs", "eval", env=env, cwd=tmp_path)
            assert "weights from epoch 2" in logs.stdout, logs.stdout[-2000:]
    assert (tmp_path / "report" / "report.html").is_file()
