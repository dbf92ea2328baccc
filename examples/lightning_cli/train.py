"""A LightningCLI app as a user writes it, run by gpuq unchanged (docs/your-project.md, "PyTorch Lightning").

    python train.py fit --config config.yaml [--model.lr 0.1] [--seed_everything 1] [--ckpt_path last.ckpt]

Everything Lightning does by itself: CSVLogger writes lightning_logs/version_N/metrics.csv (a new
version_N for every start of ``fit``), ModelCheckpoint(save_last=True) writes
lightning_logs/version_N/checkpoints/{epoch=N-step=M,last}.ckpt, ``--ckpt_path`` resumes.  The data is
made in memory from the seed: nothing is downloaded."""

from __future__ import annotations

import os
import time

import torch
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(LightningModule):
    def __init__(self, lr: float = 0.05, hidden: int = 16, epoch_sleep: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_train_epoch_end(self) -> None:
        # a slow epoch for tests that kill a job mid-run (the trainer's own knob, not gpuq's)
        if self.hparams.epoch_sleep:
            time.sleep(self.hparams.epoch_sleep)
        print(f"epoch {self.current_epoch + 1}/{self.trainer.max_epochs} rank {self.global_rank} "
              f"pid {os.getpid()}", flush=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class DataModule(LightningDataModule):
    def __init__(self, samples: int = 256, batch_size: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(1234)  # the same data for every seed: seeds vary the model
        x = torch.randn(self.hparams.samples, 8, generator=g)
        y = x[:, :1] * 2.0 - x[:, 1:2] + 0.1 * torch.randn(self.hparams.samples, 1, generator=g)
        cut = self.hparams.samples * 3 // 4
        self.train_set, self.val_set = TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:], y[cut:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.hparams.batch_size)


if __name__ == "__main__":
    LightningCLI(Model, DataModule)
