"""examples/ddp_snapshot teaches "your own project": its validation set must follow the training set's
labelling rule (one problem, whatever the seed), so val_acc can rise (issue 39 item 4), and it carries no
test scaffolding (tests/integration/test_own_project.py adds its own secret probe)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_snapshot" / "train.py"


def _example() -> object:
    spec = importlib.util.spec_from_file_location("ddp_snapshot_train", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_validation_follows_the_training_sets_rule() -> None:
    example = _example()
    train_x, train_y = example.make_dataset(2048, 0).tensors  # type: ignore[attr-defined]
    val_x, val_y = example.make_dataset(512, 1000).tensors  # type: ignore[attr-defined]
    assert not torch.equal(train_x[:512], val_x)  # other points ...
    w = torch.linalg.lstsq(train_x, (2.0 * train_y - 1).unsqueeze(1)).solution.squeeze(1)
    accuracy = ((val_x @ w > 0).long() == val_y).float().mean().item()
    assert accuracy > 0.9  # ... labelled by the same rule: a linear fit of the training set generalises


def test_the_example_carries_no_test_scaffolding() -> None:
    text = EXAMPLE.read_text()
    assert "WANDB" not in text and "secret" not in text
