"""The step boundary: what every rank agrees on before the next step, and the stop on a signal.

SIGTERM/SIGINT (docs/checkpoints.md): the handler only records the signal and its time.  At each step
boundary one all-reduce (max) of [stop, non-finite, timer due, seconds since the signal, step time,
save time] gives every rank the same numbers, so every rank takes the same decision at the same
boundary: save a final checkpoint when it fits in the grace (grace.py), else skip it; then barrier
and exit 143.  When steps are long against the grace, a second agreement after the forward pass
decides whether to finish the step (it and a save fit) or abandon it unapplied and exit unsaved.
A mixin of ``trainer.Trainer`` (its saves are ``trainstate.Checkpointing``'s, its lines ``progress.Progress``'s).
"""

from __future__ import annotations

import math
import sys
import time

import torch

from . import contract, grace, signals
from .progress import fmt, num


class Stopping:
    """The trainer's step boundary: the agreement of all ranks, a stop on a signal, divergence."""

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
                               "loss": num(self.last_loss), "lr": self.lr, "time": time.time()})
            self.log(f"epoch {self.epoch + 1}/{self.epochs} step {self.step}/{self.total_steps} "
                     f"loss={fmt(self.last_loss)} lr={self.lr:.6g}")
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
