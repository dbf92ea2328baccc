"""The bytecode of what the suite's trainers import, compiled once per installation as a run starts.

CI installs with ``pip --no-compile`` (README), and no trainer writes bytecode: gpuq's wrapper gives it
PYTHONDONTWRITEBYTECODE=1, and so does the GPU preflight's torch probe.  The suite's own processes do
write it, but they import only torch's core (a test module's import at collection), never what a rank
imports besides: ``torch._dynamo`` (DistributedDataParallel and every ``torch.optim`` optimizer import
it), sympy, ``torch.distributed``'s launcher and rendezvous.  So until some test happened to import those
with bytecode written (the Lightning test's ``warm_bytecode``, ten minutes into a CI run), every rank
compiled them from source again: measured on 2 cores, 5.4 s of CPU per payload rank instead of 2.5 s,
and 8.0 s instead of 4.1 s for the Hugging Face example's imports.  A user's ``pip install`` compiles
at install time, so this only gives the suite what every user's machine has.

``start`` runs in the run's first process, before any test, in the background; it is a no-op where
the bytecode is cached already (any second run on the same installation).
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# what a payload rank and its torchrun launcher import (python -v of a torchrun job of payload/train.py:
# after this, none of torch's modules is compiled from source)
TORCH_IMPORTS = ("import torch, torch._dynamo, torch.distributed.run, torch.nn.parallel, torch.optim, "
                 "torch.utils.data, torch.distributed.elastic.rendezvous.c10d_rendezvous_backend")
# one module of each closure, whose cached bytecode says the closure was compiled
TORCH_SENTINELS = ("_dynamo/symbolic_convert.py", "distributed/elastic/rendezvous/c10d_rendezvous_backend.py")


def _cached(package: str, relative: str) -> bool | None:
    """Whether ``package``'s module file ``relative`` has cached bytecode; None when not installed, or
    where no bytecode can be written (a read-only installation).  A top-level package's find_spec
    imports nothing."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    source = os.path.join(os.path.dirname(spec.origin), relative)
    if os.path.exists(importlib.util.cache_from_source(source)):
        return True
    return False if os.access(os.path.dirname(source), os.W_OK) else None


def script(scratch: Path) -> str:
    """A shell script of the commands that compile what is not cached yet ("" when everything is)."""
    steps: list[str] = []
    if False in (_cached("torch", s) for s in TORCH_SENTINELS):  # installed, not compiled
        steps.append(shlex.join([sys.executable, "-c", TORCH_IMPORTS]))
    if _cached("transformers", "trainer.py") is False:  # examples/hf_trainer, run as a job would run it
        app = scratch / "hf_trainer"
        shutil.copytree(ROOT / "examples" / "hf_trainer", app, ignore=shutil.ignore_patterns("__pycache__", "out"))
        steps.append(f"cd {shlex.quote(str(app))} && "
                     + shlex.join([sys.executable, "train.py", "--max_steps", "2", "--save_steps", "2"]))
    return " && ".join(steps)


class Warmer:
    """The background compile of one run: ``start`` it first, ``finish`` it last."""

    def __init__(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="gpuq-bytecode-"))
        self.log = self.scratch / "warm.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Warmer:
        todo = script(self.scratch)
        if todo:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env.update({"HF_HUB_OFFLINE": "1", "HF_HOME": str(self.scratch / "hf-home"), "OMP_NUM_THREADS": "1",
                        "CUDA_VISIBLE_DEVICES": ""})
            with open(self.log, "wb") as log:
                self.proc = subprocess.Popen(["sh", "-c", todo], cwd=self.scratch, env=env, stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT)
        return self

    def finish(self) -> str:
        """Wait for the compile; what went wrong ("" when nothing did).  The scratch dir goes."""
        problem = ""
        if self.proc is not None:
            try:
                code = self.proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait()
            if code != 0:
                problem = f"compiling the trainers' bytecode failed (exit {code}): " + \
                          self.log.read_text(errors="replace")[-2000:]
        shutil.rmtree(self.scratch, ignore_errors=True)
        return problem
