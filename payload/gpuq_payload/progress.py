"""What the trainer tells (rank 0 only): its stdout lines, its metrics rows, its heartbeat.

``metrics.jsonl`` is appended one row per logged step and per epoch's eval; a resume first trims the rows
written after its checkpoint (they are written again, identically).  A mixin of ``trainer.Trainer``: it
reads the trainer's ``main``, ``metrics_path``, ``hb``, ``step``, ``epoch``, ``epochs``, ``total_steps``,
``last_loss`` and ``optimizer``.
"""

from __future__ import annotations

import json
import math
import os


def num(x: float) -> float | None:
    """A metrics row's number: the float, or None (JSON null) when it is not finite."""
    return float(x) if math.isfinite(x) else None


def fmt(x: float) -> str:
    """A log line's number: four decimals, or nan / inf / -inf."""
    return f"{x:.4f}" if math.isfinite(x) else ("nan" if x != x else ("inf" if x > 0 else "-inf"))


class Progress:
    """The trainer's words: log lines, metrics rows (and their trim on resume), heartbeats."""

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
