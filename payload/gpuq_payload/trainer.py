"""The training loop: DDP, per-step stop/checkpoint agreement, eval, checkpoints, results.

SIGTERM/SIGINT (docs/checkpoints.md): the handler only records the signal and its time.  At each step
boundary one all-reduce (max) of [stop, non-finite, timer due, seconds since the signal, step time,
save time] gives every rank the same numbers, so every rank takes the same decision at the same
boundary: save a final checkpoint when it fits in the grace (grace.py), else skip it; then barrier
and exit 143.  When steps are long against the grace, a second agreement after the forward pass
decides whether to finish the step (it and a save fit) or abandon it unapplied and exit unsaved.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from . import ConfigError, checkpoint, contract, grace, rng, signals
from .data import SkipSampler, augment, make_datasets
from .distributed import per_parameter_allreduce
from .heartbeat import Heartbeat, write_json_atomic
from .model import MLP

CKPT_FORMAT = 1


def lr_factor(step: int, warmup: int, total: int, kind: str) -> float:
    """Linear warmup over ``warmup`` steps, then constant or cosine decay to 0 at ``total``."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, max(0.0, (step - warmup) / span))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _fmt(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else ("nan" if x != x else ("inf" if x > 0 else "-inf"))


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


class Trainer:
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

    # ---------------------------------------------------------------- logging
    def log(self, msg: str) -> None:
        if self.main:
            print(msg, flush=True)

    def metrics_line(self, doc: dict) -> None:
        if self.main:
            with open(self.metrics_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(doc, sort_keys=True) + "\n")

    def beat(self, phase: str, force: bool = False) -> None:
        self.hb.beat(step=self.step, total_steps=self.total_steps, epoch=min(self.epoch + 1, self.epochs),
                     epochs=self.epochs, loss=self.last_loss, lr=self.lr, phase=phase, force=force)

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    # ---------------------------------------------------------------- setup
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

    # ---------------------------------------------------------------- checkpoints
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

    def trim_metrics(self) -> None:
        """Drop metrics lines written after the checkpoint (they will be written again identically)."""
        if not os.path.isfile(self.metrics_path):
            return
        kept = []
        with open(self.metrics_path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                train_ok = doc.get("kind") == "train" and doc.get("step", 0) <= self.step
                eval_ok = doc.get("kind") == "eval" and doc.get("epoch", 0) <= self.epoch
                if train_ok or eval_ok:
                    kept.append(doc)
        tmp = self.metrics_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            for doc in kept:
                fh.write(json.dumps(doc, sort_keys=True) + "\n")
        os.replace(tmp, self.metrics_path)

    # ---------------------------------------------------------------- loop
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

    # ---------------------------------------------------------------- SIGTERM
    def abandon_step(self) -> bool:
        """Between forward and backward: when steps are long against the grace, agree (every rank,
        same numbers) whether a signal leaves time to finish this step and save; if not, the step is
        abandoned before anything is applied.  Short steps, or an unknown grace: always finish."""
        if not grace.midstep_check(self.grace, self.agreed_step_s):
            return False
        since = signals.elapsed()
        agreed = self.dist.all_reduce(
            torch.tensor([-1.0 if since is None else since], dtype=torch.float64, device=self.device), "max")
        elapsed = float(agreed.item())
        if elapsed < 0:
            return False
        need = grace.step_need(elapsed, self.agreed_step_s, self.agreed_save_s)
        if need <= self.grace:
            self.log(f"SIGTERM in step {self.step + 1}: finishing it ({elapsed:.2f} s since signal + (step "
                     f"{self.agreed_step_s:.2f} s + save {self.agreed_save_s:.2f} s) x {grace.SAFETY} + margin "
                     f"{grace.MARGIN_S} s = {need:.2f} s <= grace {self.grace:.2f} s)")
            return False
        self.log(f"SIGTERM in step {self.step + 1}: step abandoned (not applied), final checkpoint skipped: "
                 f"{elapsed:.2f} s since signal + (step {self.agreed_step_s:.2f} s + save "
                 f"{self.agreed_save_s:.2f} s) x {grace.SAFETY} + margin {grace.MARGIN_S} s = {need:.2f} s "
                 f"> grace {self.grace:.2f} s; resume anchor stays {self.anchor}")
        return True

    def signalled_before_training(self) -> bool:
        """A signal during start-up or resume: the state is the anchor's, so leave before a first step
        (which may not fit the grace).  One agreement, once per run."""
        flag = torch.tensor([float(signals.requested())], dtype=torch.float64, device=self.device)
        if float(self.dist.all_reduce(flag, "max").item()) <= 0:
            return False
        self.log(f"SIGTERM before the first step: nothing new to save; resume anchor stays {self.anchor}")
        return True

    def stop_exit(self) -> int:
        """Every rank leaves together: barrier (nobody is left in a collective), heartbeat, 143."""
        self.dist.barrier()
        self.beat("train", force=True)
        return contract.EXIT_SIGTERM

    def final_save(self, elapsed: float) -> None:
        """At a boundary after a signal: write the last checkpoint if it completes within the grace."""
        if not self.s.ckpt_on_sigterm:
            self.log(f"SIGTERM at step {self.step}: final checkpoint skipped: disabled by "
                     f"{contract.ENV_CKPT_ON_SIGTERM}=0; resume anchor stays {self.anchor}")
            return
        if self.grace is None:
            self.save("signal")  # grace unknown: save and hope (the write is atomic either way)
            return
        need = grace.save_need(elapsed, self.agreed_save_s)
        numbers = (f"{elapsed:.2f} s since signal + save {self.agreed_save_s:.2f} s x {grace.SAFETY} + margin "
                   f"{grace.MARGIN_S} s = {need:.2f} s")
        if need > self.grace:
            self.log(f"SIGTERM at step {self.step}: final checkpoint skipped: {numbers} > grace "
                     f"{self.grace:.2f} s; resume anchor stays {self.anchor}")
            return
        self.log(f"SIGTERM at step {self.step}: final checkpoint: {numbers} <= grace {self.grace:.2f} s")
        self.save("signal")

    def boundary(self, loss: float | None) -> int | None:
        """Step boundary: agree on stop / divergence / checkpoint (rank 0 decides the timer) and on
        the numbers of the grace decision (max over ranks: the earliest signal, the slowest step)."""
        nonfinite = loss is not None and not math.isfinite(loss)
        due = False
        if self.main:
            every = self.cfg["ckpt_every_steps"]
            due = (loss is not None and every > 0 and self.step % every == 0) or (
                time.monotonic() - self.last_ckpt_t >= self.s.ckpt_interval_s)
        since = signals.elapsed()
        step_s = save_s = 0.0
        if self.grace is not None:
            step_s = self.timings.step_s()
            measured = self.timings.measured_save_s()
            save_s = measured if measured is not None else self.timings.save_s(self.state_bytes())
        flags = torch.tensor([float(signals.requested()), float(nonfinite), float(due),
                              -1.0 if since is None else since, step_s, save_s],
                             dtype=torch.float64, device=self.device)
        flags = self.dist.all_reduce(flags, "max").tolist()
        stop, diverged, due = flags[0] > 0, flags[1] > 0, flags[2] > 0
        elapsed, self.agreed_step_s, self.agreed_save_s = flags[3], flags[4], flags[5]
        if loss is not None and (self.step % self.cfg["log_every_steps"] == 0 or diverged):
            mean = self.dist.all_reduce(torch.tensor([loss], dtype=torch.float64, device=self.device))
            self.last_loss = float(mean.item()) / self.world
            self.metrics_line({"kind": "train", "step": self.step, "epoch": self.epoch + 1,
                               "loss": _num(self.last_loss), "lr": self.lr, "time": time.time()})
            self.log(f"epoch {self.epoch + 1}/{self.epochs} step {self.step}/{self.total_steps} "
                     f"loss={_fmt(self.last_loss)} lr={self.lr:.6g}")
        if loss is not None:
            self.beat("train")
        if diverged:
            if self.main:
                print(f"non-finite loss at step {self.step}", file=sys.stderr, flush=True)
            self.beat("train", force=True)
            self.dist.barrier()
            return contract.EXIT_DIVERGED
        if stop:
            self.log(f"stop requested by signal at step {self.step}")
            self.final_save(elapsed)
            return self.stop_exit()
        if due:
            self.save("periodic")
        return None

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
        return {"kind": "eval", "step": self.step, "epoch": self.epoch + 1, "val_loss": _num(val_loss),
                "val_acc": _num(val_acc), "time": time.time()}

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
                 f"val_loss={_fmt(ev['val_loss'] if ev['val_loss'] is not None else math.nan)} "
                 f"val_acc={_fmt(ev['val_acc'] if ev['val_acc'] is not None else math.nan)}"
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
