"""Process-group setup and collectives that degrade to no-ops for a single plain process.

Only tensor collectives cross between ranks.  Documents (RNG states, the resume choice) travel as
UTF-8 JSON in a uint8 tensor after an int64 length, bounded by ``MAX_DOC_BYTES``: never pickle, so a
rank on another host cannot make this one run code by what it sends (torch's ``*_object``
collectives unpickle whatever a peer sends, docs/security.md).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os

import torch
import torch.distributed as tdist

MAX_DOC_BYTES = 1 << 20  # one rank's document; RNG states are about 30 KB


class PeerDocumentError(RuntimeError):
    """A rank sent a document that is not bounded, well-formed JSON."""


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

    def gather_json(self, doc) -> list:
        """Every rank's JSON-able ``doc``, indexed by rank (two tensor all_gathers: lengths, bytes)."""
        data = _encode(doc)
        if not self.initialized:
            return [_decode(data, 0)]  # the same round trip as with peers: the same types either way
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        sizes = [torch.zeros_like(size) for _ in range(self.world)]
        tdist.all_gather(sizes, size)
        lengths = [int(n.item()) for n in sizes]
        _check_lengths(lengths)  # every rank sees the same lengths, so every rank stops alike
        width = max(lengths)
        mine = torch.zeros(width, dtype=torch.uint8, device=self.device)
        mine[:len(data)] = _as_tensor(data).to(self.device)
        boxes = [torch.empty(width, dtype=torch.uint8, device=self.device) for _ in range(self.world)]
        tdist.all_gather(boxes, mine)
        return [_decode(bytes(boxes[r][:n].cpu().tolist()), r) for r, n in enumerate(lengths)]

    def broadcast_json(self, doc):
        """Everyone gets rank 0's JSON-able ``doc`` (two tensor broadcasts: length, bytes)."""
        data = _encode(doc) if self.is_main else b""
        if not self.initialized:
            return _decode(data, 0)
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        tdist.broadcast(size, src=0)
        n = int(size.item())
        _check_lengths([n])
        box = _as_tensor(data).to(self.device) if self.is_main else torch.empty(n, dtype=torch.uint8,
                                                                               device=self.device)
        tdist.broadcast(box, src=0)
        return _decode(bytes(box.cpu().tolist()), 0)

    def close(self) -> None:
        if self.initialized and tdist.is_initialized():
            with contextlib.suppress(Exception):  # best effort at exit
                tdist.destroy_process_group()
            self.initialized = False


def _encode(doc) -> bytes:
    data = json.dumps(doc, sort_keys=True, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return data


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def _check_lengths(lengths: list) -> None:
    for rank, n in enumerate(lengths):
        if not 0 < n <= MAX_DOC_BYTES:
            raise PeerDocumentError(f"rank {rank} sent a document of {n} bytes (1 to {MAX_DOC_BYTES} allowed)")


def _decode(data: bytes, rank: int):
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PeerDocumentError(f"rank {rank} sent a document that is not JSON: {exc}") from None


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
