"""A tiny Hugging Face ``Trainer`` project, unchanged by gpuq (docs/your-project.md, "HF Trainer").

A one-layer GPT-2 with random weights learns a synthetic next-token task it makes itself (no hub
download, no tokenizer).  ``Trainer`` saves ``out/checkpoint-<step>/`` directories every ``--save_steps``
steps and resumes with ``--resume_from_checkpoint DIR``: what gpuq passes as ``{checkpoint}``.

    python train.py --max_steps 12 --save_steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Sequences(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Counting sequences modulo the vocabulary: token t+1 follows token t."""

    def __init__(self, n: int, length: int, vocab: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (starts + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Report(TrainerCallback):  # type: ignore[misc]
    """One log line per step (gpuq's progress) and one JSON line per logged loss (gpuq's metrics)."""

    def __init__(self, metrics: str, step_sleep: float) -> None:
        self.metrics, self.step_sleep = metrics, step_sleep

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        print(f"step {state.global_step}/{state.max_steps}", flush=True)
        time.sleep(self.step_sleep)  # a stand-in for real work: room to interrupt it

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[no-untyped-def]
        if logs and "loss" in logs:
            with open(self.metrics, "a") as f:
                f.write(json.dumps({"step": state.global_step, "loss": logs["loss"]}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--max_steps", type=int, default=12)
    p.add_argument("--save_steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--seed", type=int, default=int(os.environ.get("GPUQ_SEED") or 0))
    p.add_argument("--step_sleep", type=float, default=0.0)
    p.add_argument("--resume_from_checkpoint", default=None)
    args = p.parse_args()
    vocab = 32
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    training = TrainingArguments(
        output_dir="out", max_steps=args.max_steps, save_strategy="steps", save_steps=args.save_steps,
        logging_steps=1, per_device_train_batch_size=8, learning_rate=args.lr, seed=args.seed, report_to=[],
        disable_tqdm=True, dataloader_num_workers=0, use_cpu=not torch.cuda.is_available())
    trainer = Trainer(model=model, args=training, train_dataset=Sequences(256, 16, vocab, args.seed),
                      callbacks=[Report("metrics.jsonl", args.step_sleep)])
    if args.resume_from_checkpoint:
        with open(os.path.join(args.resume_from_checkpoint, "trainer_state.json")) as f:
            state = json.load(f)
        print(f"resuming from {args.resume_from_checkpoint} at step {state['global_step']}", flush=True)
    trainer.train(resume_from_checkpoint=args.resume_from_checkpoint or None)
    print(f"done at step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
