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
    """Tensors and plain Python values only, so a checkpoint loads with ``weights_only=True`` (never
    arbitrary pickle: a checkpoint may come back from another host, docs/security.md)."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if _np is not None:
        kind, keys, pos, has_gauss, cached = _np.random.get_state()
        state["numpy"] = (str(kind), torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss),
                          float(cached))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if _np is not None and state.get("numpy") is not None:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        _np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
