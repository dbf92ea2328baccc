"""Capture and restore the RNG state of one process (python, numpy if importable, torch CPU, CUDA)."""

from __future__ import annotations

import random

import torch

try:  # numpy is optional on the payload side
    import numpy as _np
except ImportError:  # pragma: no cover - depends on the host image
    _np = None


def seed_all(seed: int) -> None:
    random.seed(seed)
    if _np is not None:
        _np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def capture() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if _np is not None:
        state["numpy"] = _np.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if _np is not None and state.get("numpy") is not None:
        _np.random.set_state(state["numpy"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
