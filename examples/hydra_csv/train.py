"""A Hydra application: a small MLP on a synthetic task, metrics to metrics.csv, resumable.

    python train.py model.width=64 optim.lr=1e-2
    python train.py +resume=checkpoint.pt      # continue from a checkpoint written by an earlier run

Hydra's defaults are kept: the run directory Hydra creates (outputs/<date>/<time>/) holds its logs
and the composed config; the script's own files (metrics.csv, checkpoint.pt) go to the directory it
was started in (hydra.job.chdir is false by default in Hydra >= 1.2).
"""

import csv
import os

import hydra
import torch
import torch.nn.functional as F
from omegaconf import DictConfig


def make_data(size, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 16, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return x, y


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    torch.manual_seed(cfg.seed)
    x, y = make_data(cfg.data.size, cfg.seed)
    vx, vy = make_data(max(cfg.data.size // 4, 64), cfg.seed + 1)
    model = torch.nn.Sequential(torch.nn.Linear(16, cfg.model.width), torch.nn.ReLU(),
                                torch.nn.Linear(cfg.model.width, 2))
    optim = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
    start = 0
    resume = cfg.get("resume")
    if resume:
        state = torch.load(resume)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        start = state["epoch"]
        print(f"resumed from {resume} at epoch {start}", flush=True)
    new = not os.path.exists(cfg.metrics_file)
    with open(cfg.metrics_file, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["epoch", "train_loss", "val_acc", "resumed"])
        for epoch in range(start, cfg.epochs):
            perm = torch.randperm(len(x))
            total = 0.0
            for i in range(0, len(x), cfg.data.batch_size):
                idx = perm[i:i + cfg.data.batch_size]
                optim.zero_grad()
                loss = F.cross_entropy(model(x[idx]), y[idx])
                loss.backward()
                optim.step()
                total += loss.item()
            with torch.no_grad():
                acc = (model(vx).argmax(dim=1) == vy).float().mean().item()
            steps = (len(x) + cfg.data.batch_size - 1) // cfg.data.batch_size
            writer.writerow([epoch + 1, f"{total / steps:.6f}", f"{acc:.6f}", int(epoch == start and start > 0)])
            f.flush()
            tmp = cfg.checkpoint_file + ".tmp"
            torch.save({"model": model.state_dict(), "optim": optim.state_dict(), "epoch": epoch + 1}, tmp)
            os.replace(tmp, cfg.checkpoint_file)
            print(f"epoch {epoch + 1}/{cfg.epochs} loss {total / steps:.4f} val_acc {acc:.4f}", flush=True)


if __name__ == "__main__":
    main()
