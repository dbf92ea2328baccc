"""The trainer's state in a checkpoint: what it holds, the collective save, and the resume.

Rank 0 picks the checkpoint to resume from and verifies it; every rank learns the choice (or the error)
by one broadcast before anyone reads a file, then restores model, optimizer, scheduler, scaler, its own
RNG streams and the sampler's position, so the resumed run is the uninterrupted one, bit for bit.  A
mixin of ``trainer.Trainer``: it reads and sets the trainer's progress state (``epoch``, ``batch``,
``step``, ``best``, ``last_eval``) and its grace bookkeeping (``timings``, ``anchor``, ``last_ckpt_t``).
"""

from __future__ import annotations

import os
import time

import torch

from . import ConfigError, checkpoint, contract, rng

CKPT_FORMAT = 1
_CHOICE_KEYS = ("path", "sha256", "in_ckpt_dir", "error")


def resume_choice(doc) -> dict | None:
    """Rank 0's resume choice as the other ranks received it: None, or strings under known keys
    (path + sha256 [+ in_ckpt_dir], or error); anything else is refused."""
    if doc is None:
        return None
    if not (isinstance(doc, dict) and doc and set(doc) <= set(_CHOICE_KEYS)
            and all(isinstance(v, str) and len(v) <= 65536 for v in doc.values())
            and ("error" in doc or {"path", "sha256"} <= set(doc))):
        raise checkpoint.CheckpointError(f"rank 0 sent a resume choice of the wrong shape: {str(doc)[:200]}")
    return doc


class Checkpointing:
    """The trainer's checkpoint side: its state, the save every rank joins, the resume."""

    def state(self, rng_states: list) -> dict:
        return {
            "format": CKPT_FORMAT,
            "model": checkpoint.unwrap_state_dict(self.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": rng_states,  # one entry per rank, indexed by rank
            "sampler": {"epoch": self.epoch, "batches_consumed": self.batch, "seed": self.s.seed},
            "epoch": self.epoch,
            "step": self.step,
            "best": {"metric": self.metric, "mode": self.mode, "eval": self.best},
            "last_eval": self.last_eval,
            "meta": dict(self.s.meta, world_size=self.world, batch_size=self.bs, epochs=self.epochs,
                         total_steps=self.total_steps, written_at=time.time(),
                         save_s_recent=list(self.timings.saves)),  # a prior for the next attempt
        }

    def save(self, why: str) -> None:
        """Collective: every rank contributes its RNG state; rank 0 writes; all meet at a barrier.
        The whole of it (gather, write, fsync, rename, pointer, barrier) is the measured save time."""
        t0 = time.monotonic()
        rng_states = [rng.from_doc(doc) for doc in self.dist.gather_json(rng.to_doc(rng.capture()))]
        doc = None
        if self.main:
            doc = checkpoint.save_checkpoint(self.state(rng_states), self.s.ckpt_dir, step=self.step,
                                             epoch=self.epoch)
        self.dist.barrier()
        self.last_ckpt_t = time.monotonic()
        took = self.last_ckpt_t - t0
        self.timings.add_save(took)
        self.anchor = f"step={self.step}"
        if doc is not None:
            self.log(f"checkpoint ({why}) step={self.step} epoch={self.epoch} batch={self.batch} "
                     f"sha256={doc['sha256']} bytes={doc['bytes']} save_s={took:.3f}")

    def state_bytes(self) -> int:
        """Bytes of the tensors a checkpoint holds (model + optimizer), for the first save estimate."""
        if self._state_bytes is None or self.step <= 1:
            n = sum(t.numel() * t.element_size() for t in self.model.state_dict().values())
            for st in self.optimizer.state.values():
                n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
            self._state_bytes = int(n)
        return self._state_bytes

    def resume(self) -> None:
        # rank 0 picks and verifies; everyone learns the outcome before reading (no collective in `if rank 0`)
        choice = None
        if self.main:
            try:
                found = checkpoint.resolve_resume(self.s.ckpt_dir, self.s.resume_from)
                if found is not None:
                    path, expected = found
                    choice = {"path": path, "sha256": checkpoint.verify(path, expected)}
                    inside = os.path.relpath(os.path.abspath(path), os.path.abspath(self.s.ckpt_dir))
                    if not inside.startswith(os.pardir):
                        choice["in_ckpt_dir"] = inside  # another node's ckpt dir may lie elsewhere
            except checkpoint.CheckpointError as exc:
                choice = {"error": str(exc)}
        choice = resume_choice(self.dist.broadcast_json(choice))
        if choice is None:
            return
        if "error" in choice:
            raise checkpoint.CheckpointError(choice["error"])
        if "in_ckpt_dir" in choice:  # the same file under this node's own ckpt dir (multi-node over SSH hosts)
            choice["path"] = os.path.join(self.s.ckpt_dir, choice["in_ckpt_dir"])
        ck = checkpoint.load_checkpoint(choice["path"], check=False)
        ws = ck.get("meta", {}).get("world_size")
        if ws != self.world:
            raise ConfigError(f"checkpoint {choice['path']} was written with world size {ws}, this run has "
                              f"{self.world}; resume with the same world size")
        if ck.get("format") != CKPT_FORMAT:
            raise ConfigError(f"checkpoint {choice['path']} has format {ck.get('format')}, "
                              f"expected {CKPT_FORMAT}")
        self.model.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.scheduler.load_state_dict(ck["scheduler"])
        if self.scaler is not None and ck.get("scaler"):
            self.scaler.load_state_dict(ck["scaler"])
        rng.restore(ck["rng"][self.rank])
        self.epoch = ck["sampler"]["epoch"]
        self.batch = ck["sampler"]["batches_consumed"]
        self.step = ck["step"]
        self.best = ck["best"]["eval"]
        self.last_eval = ck.get("last_eval")
        for took in ck.get("meta", {}).get("save_s_recent") or []:
            self.timings.add_save(took)  # until this attempt measures its own saves
        self.anchor = f"step={self.step} (resumed)"
        if self.main:
            self.trim_metrics()
        self.log(f"{contract.RESUMED_MARKER} step={self.step} epoch={self.epoch} sha256={choice['sha256']}")
        self.dist.barrier()
