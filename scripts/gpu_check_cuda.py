#!/usr/bin/env python3
"""The CUDA side of scripts/gpu_check.py: each check runs in a process of its own.

``python scripts/gpu_check_cuda.py probe|amp|checkpoint MIB DIR|scaler CKPT_DIR|leak READY_FILE`` prints one
``GPUQ_CHECK {json}`` line.  gpu_check.py itself never touches CUDA, so no context of its own
shows up in what the agent's ``health`` and ``reap`` see, and a crash here is one FAIL row.

- ``probe``: torch and CUDA versions, the device count and names, NCCL availability.  No tensor
  is allocated.
- ``amp``: autocast to float16 on cuda:0 and ``torch.amp.GradScaler("cuda")`` exactly as the
  payload's trainer builds it: a finite step is applied, a step with an inf gradient is skipped
  and the scale halves.
- ``checkpoint``: save and load MIB of CUDA tensors through the payload's own atomic checkpoint
  code (tmp + fsync + rename + LATEST pointer; load verifies the sha256); times both.
- ``scaler``: the GradScaler state in the checkpoint a ckpt directory's LATEST names.
- ``leak``: the leaked CUDA context for the reaper check.  Forks; the parent exits at once, so the
  child is orphaned (re-parented to init or a subreaper) in a session of its own; the child
  allocates 256 MiB on cuda:0, writes READY_FILE ``{"pid", "start_ticks"}`` and sleeps (at most
  15 minutes, so a check that dies never leaves it behind for long).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LEAK_MIB = 256
LEAK_MAX_S = 900.0


def emit(doc: dict[str, Any]) -> None:
    print("GPUQ_CHECK " + json.dumps(doc, sort_keys=True), flush=True)


def probe() -> dict[str, Any]:
    import torch
    import torch.distributed as tdist

    available = torch.cuda.is_available()
    count = torch.cuda.device_count() if available else 0
    names = [torch.cuda.get_device_name(i) for i in range(count)]
    nccl = bool(tdist.is_available() and tdist.is_nccl_available())
    nccl_version = None
    if nccl and count:
        try:
            nccl_version = ".".join(str(x) for x in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
        except Exception:  # some builds cannot say; the training check shows NCCL at work anyway
            nccl_version = None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "available": available, "count": count,
            "names": names, "nccl": nccl, "nccl_version": nccl_version}


def amp() -> dict[str, Any]:
    import torch

    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 8).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")  # the payload's construction (gpuq_payload/trainer.py)
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 8, (32,), device=device)

    def step(poison: bool) -> dict[str, Any]:
        before = model.weight.detach().clone()
        scale = float(scaler.get_scale())
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            out = model(x)
            loss = torch.nn.functional.cross_entropy(out.float(), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
        if poison:
            assert model.weight.grad is not None
            model.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        return {"fp16": out.dtype == torch.float16, "applied": not torch.equal(before, model.weight.detach()),
                "scale": scale, "scale_after": float(scaler.get_scale()), "loss": float(loss.item())}

    finite = [step(poison=False) for _ in range(8)]  # an early step may overflow at 2**16: the scaler backs off
    poisoned = step(poison=True)
    torch.cuda.synchronize()
    return {"finite_steps": finite, "inf_step": poisoned}


def checkpoint(mib: int, directory: str) -> dict[str, Any]:
    import torch

    sys.path.insert(0, str(REPO / "payload"))
    from gpuq_payload.checkpoint import load_checkpoint, save_checkpoint  # type: ignore[import-not-found]

    device = torch.device("cuda", 0)
    gen = torch.Generator(device=device).manual_seed(0)
    per = 16 * (1 << 20) // 4  # 16 MiB of float32 per tensor
    tensors = {f"w{i}": torch.randn(per, device=device, generator=gen) for i in range(max(1, mib // 16))}
    state = {"model": tensors, "step": 1}
    torch.cuda.synchronize()
    t0 = time.monotonic()
    doc = save_checkpoint(state, directory, step=1, epoch=0)
    save_s = time.monotonic() - t0
    t0 = time.monotonic()
    loaded = load_checkpoint(os.path.join(directory, doc["file"]), doc["sha256"])
    back = {k: v.to(device) for k, v in loaded["model"].items()}
    torch.cuda.synchronize()
    load_s = time.monotonic() - t0
    equal = back.keys() == tensors.keys() and all(torch.equal(back[k], tensors[k]) for k in tensors)
    return {"bytes": doc["bytes"], "save_s": save_s, "load_s": load_s, "equal": equal}


def scaler(ckpt_dir: str) -> dict[str, Any]:
    """The GradScaler state in the checkpoint the payload's LATEST pointer names (read on the CPU)."""
    import torch

    with open(os.path.join(ckpt_dir, "LATEST"), encoding="utf-8") as fh:
        pointer = json.load(fh)
    ck = torch.load(os.path.join(ckpt_dir, pointer["file"]), map_location="cpu", weights_only=True)
    state = ck.get("scaler")
    return {"scaler": {k: float(v) if isinstance(v, (int, float)) else repr(v) for k, v in state.items()}
            if isinstance(state, dict) else state}


def _start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        text = fh.read()
    return int(text[text.rindex(")") + 2:].split()[19])  # field 22, starttime


def leak(ready_file: str) -> None:
    if os.fork() > 0:
        os._exit(0)  # the parent goes: the child below is an orphan
    os.setsid()
    import torch

    held = torch.empty(LEAK_MIB * (1 << 20), dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    tmp = ready_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()), "bytes": held.numel()}, fh)
    os.replace(tmp, ready_file)
    deadline = time.monotonic() + LEAK_MAX_S
    while time.monotonic() < deadline:
        time.sleep(1.0)
    os._exit(0)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    what = argv[0]
    if what == "probe":
        emit(probe())
    elif what == "amp":
        emit(amp())
    elif what == "checkpoint" and len(argv) == 3:
        emit(checkpoint(int(argv[1]), argv[2]))
    elif what == "scaler" and len(argv) == 2:
        emit(scaler(argv[1]))
    elif what == "leak" and len(argv) == 2:
        leak(argv[1])
    else:
        print(f"gpu_check_cuda.py: unknown arguments {' '.join(argv)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
