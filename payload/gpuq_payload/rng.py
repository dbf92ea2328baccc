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


class RngDocError(ValueError):
    """An RNG state document (from another rank) of the wrong shape."""


def to_doc(state: dict) -> dict:
    """``capture()``'s state as plain JSON values (for the tensor-only gather, distributed.py)."""
    doc = {"python": [state["python"][0], list(state["python"][1]), state["python"][2]],
           "torch": bytes(state["torch"].tolist()).hex()}
    if state.get("numpy") is not None:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        doc["numpy"] = [kind, [int(k) for k in keys.tolist()], pos, has_gauss, cached]
    if state.get("cuda") is not None:
        doc["cuda"] = [bytes(t.tolist()).hex() for t in state["cuda"]]
    return doc


def _ints(value, n: int, low: int, high: int) -> list:
    if not (isinstance(value, list) and len(value) == n
            and all(type(v) is int and low <= v < high for v in value)):
        raise RngDocError(f"expected {n} integers in [{low}, {high})")
    return value


def _hex_bytes(value, most: int) -> torch.Tensor:
    if not (isinstance(value, str) and 0 < len(value) <= 2 * most):
        raise RngDocError(f"expected a hex string of at most {most} bytes")
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise RngDocError("expected a hex string") from None
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def _number(value, kinds: tuple):
    if type(value) not in kinds:
        raise RngDocError("expected " + " or ".join(k.__name__ for k in kinds))
    return value


def from_doc(doc) -> dict:
    """The state ``to_doc`` made, checked field by field (the document came from another rank):
    the same types ``capture()`` returns, so the checkpoint is the same either way."""
    if not isinstance(doc, dict) or not set(doc) <= {"python", "torch", "numpy", "cuda"}:
        raise RngDocError("an RNG state must be an object with python/torch[/numpy/cuda]")
    py = doc.get("python")
    if not (isinstance(py, list) and len(py) == 3 and py[0] == 3):
        raise RngDocError("python: expected [3, [625 integers], gauss]")
    gauss = None if py[2] is None else float(_number(py[2], (float, int)))
    state = {"python": (3, tuple(_ints(py[1], 625, 0, 2**32)), gauss),
             "torch": _hex_bytes(doc.get("torch"), 1 << 16)}
    if doc.get("numpy") is not None:
        npy = doc["numpy"]
        if not (isinstance(npy, list) and len(npy) == 5 and npy[0] == "MT19937"):
            raise RngDocError("numpy: expected [\"MT19937\", [624 integers], pos, has_gauss, cached]")
        keys = torch.tensor(_ints(npy[1], 624, 0, 2**32), dtype=torch.int64)
        state["numpy"] = (npy[0], keys, int(_number(npy[2], (int,))), int(_number(npy[3], (int,))),
                          float(_number(npy[4], (float, int))))
    if doc.get("cuda") is not None:
        cuda = doc["cuda"]
        if not (isinstance(cuda, list) and len(cuda) <= 64):
            raise RngDocError("cuda: expected a list of at most 64 device states")
        state["cuda"] = [_hex_bytes(h, 1 << 16) for h in cuda]
    return state
