"""Two gloo ranks on CPU that all-reduce in a loop, checkpoint a step counter in ckpt.txt and resume from it.

Under torchrun the ranks come from torchrun.  Under ``launcher = "python"`` rank 0 starts rank 1 itself, as
Lightning's DDP launcher does, and, like it, leaves it unreaped when rank 0 fails on the lost peer."""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=200)
p.add_argument("--resume", default="")
p.add_argument("--raise-at", type=int, default=0)  # rank 1 raises an AttributeError at this step (a bug of its own)
args = p.parse_args()
if "RANK" not in os.environ:  # launcher = "python": this process is rank 0 and starts rank 1
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.spawnve(os.P_NOWAIT, sys.executable, [sys.executable, *sys.argv], dict(os.environ, RANK="1", LOCAL_RANK="1"))
dist.init_process_group("gloo")
rank = dist.get_rank()
start = int(Path(args.resume).read_text()) if args.resume else 0
print(f"rank {rank} pid {os.getpid()} from step {start}", flush=True)
with open(f"rank{rank}.pid", "w") as f:
    f.write(str(os.getpid()))
t = torch.ones(16)
for step in range(start + 1, args.steps + 1):
    if rank == 1 and step == args.raise_at:
        print(t.no_such_attribute)  # a bug in one rank only: AttributeError
    dist.all_reduce(t)
    time.sleep(0.05)
    if rank == 0 and step % 10 == 0:
        with open("ckpt.tmp", "w") as f:
            f.write(str(step))
        os.replace("ckpt.tmp", "ckpt.txt")
        print(f"step {step}/{args.steps}", flush=True)
dist.destroy_process_group()
