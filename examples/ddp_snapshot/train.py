"""Distributed data-parallel training with torchrun, resumable from snapshot.pt.

Written the way the PyTorch DDP tutorials write it (no gpuq imports):

    torchrun --nproc-per-node=2 train.py 50 10 --batch_size 32

Positional arguments: total epochs and how often (in epochs) to save a snapshot. The snapshot is
saved to, and re-loaded from, snapshot.pt in the working directory, so a restarted run resumes.
Metrics go to metrics.csv (epoch, train_loss, val_acc) in the working directory.
"""

import argparse
import csv
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def ddp_setup():
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend=backend)


TASK_SEED = 0  # the labelling rule: one problem, whatever the run's seed


def make_dataset(size, seed):
    """A synthetic two-class problem (no downloads): points drawn with ``seed``, labelled by which side
    of one fixed hyperplane they fall (the same rule for the training and the validation set)."""
    w = torch.randn(20, generator=torch.Generator().manual_seed(TASK_SEED))
    x = torch.randn(size, 20, generator=torch.Generator().manual_seed(seed))
    y = (x @ w > 0).long()
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, model, train_data, val_data, optimizer, save_every, snapshot_path):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = torch.device(f"cuda:{self.local_rank}") if torch.cuda.is_available() else torch.device("cpu")
        self.model = model.to(self.device)
        self.train_data = train_data
        self.val_data = val_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)
        ids = [self.local_rank] if torch.cuda.is_available() else None
        self.model = DDP(self.model, device_ids=ids)

    def _load_snapshot(self, snapshot_path):
        snapshot = torch.load(snapshot_path, map_location=self.device)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}", flush=True)

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}",
              flush=True)
        self.train_data.sampler.set_epoch(epoch)
        total = 0.0
        for source, targets in self.train_data:
            total += self._run_batch(source.to(self.device), targets.to(self.device))
        return total / len(self.train_data)

    def _validate(self):
        self.model.eval()
        correct = 0
        seen = 0
        with torch.no_grad():
            for source, targets in self.val_data:
                pred = self.model(source.to(self.device)).argmax(dim=1)
                correct += (pred == targets.to(self.device)).sum().item()
                seen += len(targets)
        self.model.train()
        return correct / max(seen, 1)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "OPTIMIZER_STATE": self.optimizer.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        tmp = self.snapshot_path + ".tmp"
        torch.save(snapshot, tmp)
        os.replace(tmp, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}", flush=True)

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            loss = self._run_epoch(epoch)
            if self.global_rank == 0:
                acc = self._validate()
                new = not os.path.exists("metrics.csv")
                with open("metrics.csv", "a", newline="") as f:
                    writer = csv.writer(f)
                    if new:
                        writer.writerow(["epoch", "train_loss", "val_acc"])
                    writer.writerow([epoch + 1, f"{loss:.6f}", f"{acc:.6f}"])
                if (epoch + 1) % self.save_every == 0 or epoch + 1 == max_epochs:
                    self._save_snapshot(epoch + 1)


def main(total_epochs, save_every, batch_size, dataset_size, seed, snapshot_path="snapshot.pt"):
    ddp_setup()
    torch.manual_seed(seed)
    train_set = make_dataset(dataset_size, seed)
    val_set = make_dataset(max(dataset_size // 4, 64), seed + 1000)
    model = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train_data = DataLoader(train_set, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(train_set))
    val_data = DataLoader(val_set, batch_size=256)
    trainer = Trainer(model, train_data, val_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="simple distributed training job")
    parser.add_argument("total_epochs", type=int, help="Total epochs to train the model")
    parser.add_argument("save_every", type=int, help="How often to save a snapshot")
    parser.add_argument("--batch_size", default=32, type=int, help="Input batch size on each device (default: 32)")
    parser.add_argument("--dataset_size", default=2048, type=int, help="Number of synthetic training samples")
    parser.add_argument("--seed", default=0, type=int, help="Random seed")
    args = parser.parse_args()
    main(args.total_epochs, args.save_every, args.batch_size, args.dataset_size, args.seed)
