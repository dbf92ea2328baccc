"""The training loop: DDP, the epochs' steps, eval, the best model, the final save and summary.

The loop's other parts are mixins: ``stopping`` (the per-step stop/checkpoint agreement, SIGTERM),
``trainstate`` (the checkpoint's state, the collective save, the resume) and ``progress`` (log lines,
metrics rows, heartbeat).
"""

from __future__ import annotations

import math
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from . import ConfigError, checkpoint, contract, grace, rng
from .data import SkipSampler, augment, make_datasets
from .distributed import per_parameter_allreduce
from .heartbeat import Heartbeat, write_json_atomic
from .model import MLP
from .progress import Progress, fmt, num
from .stopping import Stopping
from .trainstate import Checkpointing


def lr_factor(step: int, warmup: int, total: int, kind: str) -> float:
    """Linear warmup over ``warmup`` steps, then constant or cosine decay to 0 at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / span))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class Trainer(Progress, Checkpointing, Stopping):
    """One training run on this rank: build, resume, the epochs' steps and evals, the final save and summary."""

    def __init__(self, settings, dist) -> None:
        self.s = settings
        self.dist = dist
        self.cfg = settings.cfg
        self.rank = dist.rank
        self.world = dist.world
        self.main = dist.is_main
        self.device = dist.device
        self.amp = dist.use_cuda
        self.metric, self.mode = ("val_acc", "max") if settings.task == "classify" else ("val_loss", "min")
        self.metrics_path = os.path.join(settings.result_dir, contract.METRICS_FILE)
        self.summary_path = os.path.join(settings.result_dir, contract.SUMMARY_FILE)
        self.hb = Heartbeat(settings.heartbeat_path, settings.heartbeat_s, enabled=self.main)
        # progress state (saved in checkpoints)
        self.epoch = 0  # sampler epoch in progress, 0-based
        self.batch = 0  # batches consumed within self.epoch
        self.step = 0  # global optimizer steps
        self.best: dict | None = None  # eval line of the best epoch
        self.last_eval: dict | None = None
        self.last_loss = float("nan")
        self.last_ckpt_t = time.monotonic()
        # SIGTERM grace bookkeeping
        self.grace = settings.sigterm_grace_s  # None = unknown
        self.timings = grace.Timings()
        self.agreed_step_s = 0.0  # all-reduced at the last boundary: identical on every rank
        self.agreed_save_s = 0.0
        self.anchor: str = "none (no checkpoint yet: a resume starts from scratch)"
        self._state_bytes: int | None = None

    def build(self) -> None:
        cfg, s = self.cfg, self.s
        torch.use_deterministic_algorithms(True, warn_only=self.amp)
        if self.amp:
            torch.backends.cudnn.benchmark = False
        rng.seed_all(s.seed)  # identical model init on every rank
        self.train_ds, self.val_ds, out_dim = make_datasets(s.task, cfg["data"], s.seed)
        m = cfg["model"]
        self.model = MLP(cfg["data"]["n_features"], out_dim, m["width"], m["depth"], m["dropout"])
        self.model = self.model.to(self.device)
        rng.seed_all(s.seed * 1009 + 7919 * (self.rank + 1))  # per-rank streams (dropout)
        if self.dist.initialized:
            kw = {"device_ids": [self.dist.local_rank]} if self.amp else {}
            self.ddp = DDP(self.model, **kw)
            if self.world > 2:  # a resume sums as the uninterrupted run (distributed.per_parameter_allreduce)
                self.ddp.register_comm_hook(None, per_parameter_allreduce)
            # two ranks add one pair of floats per element, whatever the bucket layout (a + b == b + a), and
            # DDP's own averaging halves before it adds as the hook does: the same bits, a third less CPU
        else:
            self.ddp = self.model
        o = cfg["optim"]
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=o["lr"], momentum=o["momentum"],
                                         weight_decay=o["weight_decay"])
        self.sampler = DistributedSampler(self.train_ds, num_replicas=self.world, rank=self.rank,
                                          shuffle=True, seed=s.seed, drop_last=True)
        self.bs = cfg["batch_size"]
        self.batches_per_epoch = len(self.sampler) // self.bs
        if self.batches_per_epoch < 1:
            raise ConfigError(f"{s.config_path}: batch_size {self.bs} x world size {self.world} exceeds "
                              f"data.n_train {cfg['data']['n_train']}")
        self.epochs = s.epochs
        self.total_steps = self.epochs * self.batches_per_epoch
        sch = cfg["schedule"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda st: lr_factor(st, sch["warmup_steps"], self.total_steps, sch["kind"]))
        self.scaler = torch.amp.GradScaler("cuda") if self.amp else None
        xv, yv = self.val_ds.tensors
        self.xv, self.yv = xv.to(self.device), yv.to(self.device)

    def run(self) -> int:
        s = self.s
        if self.main:
            os.makedirs(s.ckpt_dir, exist_ok=True)
            os.makedirs(s.result_dir, exist_ok=True)
            removed = checkpoint.cleanup_tmp(s.ckpt_dir)
            if removed:
                self.log(f"removed leftover {', '.join(removed)} from {s.ckpt_dir}")
        self.build()
        self.dist.barrier()  # nobody reads ckpt/ before the cleanup is done
        self.resume()
        self.log(f"start task={s.task} world_size={self.world} device={self.device} batch_size={self.bs} "
                 f"effective_batch={self.bs * self.world} steps={self.total_steps} seed={s.seed} "
                 f"amp={self.amp}")
        self.beat("train", force=True)
        if self.signalled_before_training():
            return self.stop_exit()
        t0 = time.monotonic()
        while self.epoch < self.epochs:
            self.sampler.set_epoch(self.epoch)
            loader = DataLoader(self.train_ds, batch_size=self.bs, drop_last=True, num_workers=0,
                                sampler=SkipSampler(self.sampler, self.batch * self.bs),
                                generator=torch.Generator())  # own generator: global RNG untouched
            for x, y in loader:
                if self.batch >= self.batches_per_epoch:
                    break
                t_step = time.monotonic()
                loss = self.train_step(x, y)
                if loss is None:  # abandoned on SIGTERM: nothing applied, nothing saved
                    return self.stop_exit()
                self.timings.add_step(time.monotonic() - t_step)
                code = self.boundary(loss)
                if code is not None:
                    return code
            code = self.end_epoch()
            if code is not None:
                return code
        self.finish(time.monotonic() - t0)
        return contract.EXIT_OK

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float | None:
        """One optimizer step; None when a SIGTERM made every rank abandon it before the backward."""
        self.ddp.train()
        x = augment(x, self.cfg["augment"], self.s.seed, self.rank, self.step)
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=self.amp):
            out = self.ddp(x)
            loss = self.loss_fn(out.float(), y)
        if self.s.test_hook_step_sleep_s > 0:  # TEST HOOK: a slow step (GPUQ_TEST_HOOK_STEP_SLEEP_S)
            if self.main:
                print(f"TEST HOOK: step {self.step + 1} sleeping {self.s.test_hook_step_sleep_s}s", flush=True)
            time.sleep(self.s.test_hook_step_sleep_s)
        if self.abandon_step():
            return None
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.batch += 1
        return float(loss.detach().item())

    def loss_fn(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.s.task == "classify":
            return F.cross_entropy(out, y)
        return F.mse_loss(out, y)

    @torch.no_grad()
    def evaluate(self) -> dict:
        self.model.eval()
        out = self.model(self.xv).float()
        if self.s.task == "classify":
            val_loss = F.cross_entropy(out, self.yv).item()
            val_acc = (out.argmax(dim=1) == self.yv).float().mean().item()
        else:
            val_loss = F.mse_loss(out, self.yv).item()
            val_acc = ((out - self.yv).abs() < 0.25).float().mean().item()  # within 0.25 std
        return {"kind": "eval", "step": self.step, "epoch": self.epoch + 1, "val_loss": num(val_loss),
                "val_acc": num(val_acc), "time": time.time()}

    def better(self, ev: dict) -> bool:
        new = ev[self.metric]
        if new is None:
            return False
        if self.best is None or self.best[self.metric] is None:
            return True
        return new > self.best[self.metric] if self.mode == "max" else new < self.best[self.metric]

    def end_epoch(self) -> int | None:
        self.beat("eval")
        ev = self.evaluate()  # every rank evaluates the whole (small) val set: identical results
        self.last_eval = ev
        improved = self.better(ev)
        if improved:
            self.best = ev
            if self.main:
                checkpoint.save_best({"model": checkpoint.unwrap_state_dict(self.model), "metrics": ev,
                                      "step": self.step, "epoch": self.epoch + 1, "task": self.s.task,
                                      "metric": self.metric, "mode": self.mode}, self.s.ckpt_dir)
        self.metrics_line(ev)
        self.log(f"epoch {self.epoch + 1}/{self.epochs} step {self.step}/{self.total_steps} "
                 f"val_loss={fmt(ev['val_loss'] if ev['val_loss'] is not None else math.nan)} "
                 f"val_acc={fmt(ev['val_acc'] if ev['val_acc'] is not None else math.nan)}"
                 + (" best" if improved else ""))
        self.epoch += 1
        self.batch = 0
        self.dist.barrier()  # best.pt complete before anyone goes on
        self.beat("train")
        return self.boundary(None)

    def finish(self, train_s: float) -> None:
        self.save("final")
        weights = checkpoint.unwrap_state_dict(self.model)
        if self.main:
            summary = {"metric": self.metric, "mode": self.mode, "final": self.last_eval, "best": self.best,
                       "weights_sha256": checkpoint.weights_sha256(weights), "world_size": self.world,
                       "effective_batch": self.bs * self.world, "steps": self.step,
                       "task": self.s.task, "epochs": self.epochs, "train_seconds": round(train_s, 3)}
            write_json_atomic(self.summary_path, summary)
            self.log(f"done steps={self.step} {self.metric}={self.last_eval and self.last_eval[self.metric]} "
                     f"weights_sha256={summary['weights_sha256']}")
        self.beat("done", force=True)
        self.dist.barrier()
