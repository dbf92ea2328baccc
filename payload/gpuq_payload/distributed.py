"""Process-group setup and collectives that degrade to no-ops for a single plain process."""

from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as tdist


class Dist:
    """Rank/world/device of this process; collectives are no-ops when no group is initialised."""

    def __init__(self, timeout_s: float, want_cuda: bool) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.use_cuda = want_cuda
        if self.use_cuda:
            torch.cuda.set_device(self.local_rank)  # before init_process_group (docs/trainer-contract.md)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self.initialized = False
        if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
            backend = "nccl" if self.use_cuda else "gloo"
            kwargs = {"backend": backend, "timeout": datetime.timedelta(seconds=timeout_s),
                      "rank": self.rank, "world_size": self.world}
            if self.use_cuda:
                kwargs["device_id"] = self.device
            tdist.init_process_group(**kwargs)
            self.initialized = True
        elif self.world != 1:
            raise RuntimeError("WORLD_SIZE > 1 without MASTER_ADDR/MASTER_PORT; launch with torchrun")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.initialized:
            if self.use_cuda:
                tdist.barrier(device_ids=[self.local_rank])
            else:
                tdist.barrier()

    def all_reduce(self, t: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.initialized:
            red = {"sum": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX}[op]
            tdist.all_reduce(t, op=red)
        return t

    def all_gather_object(self, obj) -> list:
        if not self.initialized:
            return [obj]
        out = [None] * self.world
        tdist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        """Everyone gets rank 0's ``obj``."""
        if not self.initialized:
            return obj
        box = [obj if self.is_main else None]
        tdist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if self.initialized and tdist.is_initialized():
            with contextlib.suppress(Exception):  # best effort at exit
                tdist.destroy_process_group()
            self.initialized = False


def per_parameter_allreduce(state, bucket):  # unannotated: DDP checks annotations, and here they are strings
    """DDP's gradient averaging, one parameter at a time, so that a resumed run sums exactly as an
    uninterrupted one.

    DDP packs gradients into buckets and lays them out again after the first step of every run
    (bucket rebuild): a run resumed at step k uses the first layout at step k + 1 where the
    uninterrupted run used the rebuilt one.  With three or more ranks, where a gradient sits in the
    bucket decides how the ring allreduce splits it and so in which order floats are added: the
    weights drift apart.  Reducing each parameter's slice on its own makes the order depend only on
    the parameter's size and the world size."""
    buffer = bucket.buffer()
    world = tdist.get_world_size()
    offset = 0
    for param in bucket.parameters():
        n = param.numel()
        piece = buffer[offset:offset + n]
        piece.div_(world)
        tdist.all_reduce(piece)
        offset += n
    done = torch.futures.Future()
    done.set_result(buffer)
    return done
