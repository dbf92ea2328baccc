"""The static checkpoint check (payload/agent/gpuq_base/gpuq_ckptcheck.py) agrees with torch.load(weights_only=True).

The wrapper's ``best_ckpt`` finalize check and the controller's pull check are the same code, which
reads a checkpoint without importing torch.  Here real ``torch.save`` files, and the same files
damaged in the ways a host or a disk damages them, go through both the static check and
``torch.load(..., weights_only=True)``: every file torch loads as a dict passes, every file it
refuses is refused, except two that torch loads and the check refuses on purpose (``STRICTER``).
"""

from __future__ import annotations

import io
import struct
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.core.agent_modules import ckptcheck_module
from orchestrator.transfer.verify import checkpoint_problem
from tests.support.agentmodule import load_agent_module
from tests.support.jobspecs import spec_doc

torch = pytest.importorskip("torch")

check = ckptcheck_module()


def _save(obj: object, **kw: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def _model_state() -> dict[str, object]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return {"model": net.state_dict(), "step": 7, "metrics": {"val_acc": 0.5}}


def _tied() -> dict[str, object]:
    w = torch.randn(3, 3)
    return {"a": w, "b": w, "view": w[1:], "half": w.half(), "ints": torch.arange(5), "flags": w > 0}


def _rewrite(data: bytes, change: Callable[[str, bytes], bytes | None]) -> bytes:
    """The archive with each member passed through ``change`` (None drops it), CRCs recomputed."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            new = change(info.filename, src.read(info))
            if new is not None:
                dst.writestr(info.filename, new)
    return out.getvalue()


def _drop_storage(data: bytes) -> bytes:
    return _rewrite(data, lambda name, body: None if "/data/" in name and name.endswith("/0") else body)


def _flip_storage_byte(data: bytes) -> bytes:
    """A bit flipped inside a tensor's bytes on disk (the CRC no longer matches)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = next(i for i in archive.infolist() if "/data/" in i.filename and i.file_size > 8)
    raw = bytearray(data)
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)  # the local header's own
    start = info.header_offset + 30 + name_len + extra_len
    raw[start + 4] ^= 0x01
    return bytes(raw)


def _truncate(data: bytes) -> bytes:
    return data[: len(data) // 2]


CASES: dict[str, Callable[[], bytes]] = {
    "state dict": lambda: _save(_model_state()),
    "ordered dict": lambda: _save(OrderedDict(w=torch.ones(2))),
    "shared storages, views, dtypes": lambda: _save(_tied()),
    "pickle protocol 4": lambda: _save(_model_state(), pickle_protocol=4),
    "empty dict": lambda: _save({}),
    "a list, not a dict": lambda: _save([torch.ones(2)]),
    "a bare tensor": lambda: _save(torch.ones(3)),
    "a storage member lost": lambda: _drop_storage(_save(_model_state())),
    "a flipped bit in a tensor": lambda: _flip_storage_byte(_save(_model_state())),
    "truncated": lambda: _truncate(_save(_model_state())),
    "the legacy (non-zip) format": lambda: _save(_model_state(), _use_new_zipfile_serialization=False),
}


# where the check is stricter than torch.load: torch does not test the archive's CRCs (it returns the
# damaged weights), and it reads the pre-1.6 format, which the check cannot read statically
STRICTER = {"a flipped bit in a tensor": "fails its CRC check",
            "the legacy (non-zip) format": "not a readable zip archive"}


def _torch_loads_a_dict(path: Path) -> bool:
    try:
        return isinstance(torch.load(path, map_location="cpu", weights_only=True), dict)
    except Exception:
        return False


@pytest.mark.parametrize("case", sorted(CASES))
def test_static_check_agrees_with_torch_load(tmp_path: Path, case: str) -> None:
    path = tmp_path / "best.pt"
    path.write_bytes(CASES[case]())
    static = check.checkpoint_problem(str(path))
    if case in STRICTER:
        # torch loads these; the check refuses them, and says why
        assert _torch_loads_a_dict(path), case
        assert static is not None and STRICTER[case] in static, static
        return
    assert (static is None) == _torch_loads_a_dict(path), (case, static)


def test_refusals_name_what_is_wrong(tmp_path: Path) -> None:
    found = {}
    for case in ("a storage member lost", "a flipped bit in a tensor", "a list, not a dict", "a bare tensor"):
        path = tmp_path / f"{len(found)}.pt"
        path.write_bytes(CASES[case]())
        found[case] = check.checkpoint_problem(str(path))
    assert "names storage 0, which the archive does not hold" in found["a storage member lost"]
    assert "fails its CRC check" in found["a flipped bit in a tensor"]
    assert found["a list, not a dict"] == "it does not hold a dict (a state dict) but EMPTY_LIST"
    assert found["a bare tensor"].startswith("it does not hold a dict (a state dict) but torch._utils._rebuild_tensor")


def test_wrapper_and_controller_give_one_verdict(tmp_path: Path) -> None:
    """The wrapper's finalize check (gpuq_checks, as the agent imports it) and the controller's
    (transfer/verify) say the same about every case: they are one implementation."""
    checks = load_agent_module("gpuq_attempt.gpuq_checks")
    spec = load_agent_module("gpuq_base.gpuq_jobspec").parse_spec(spec_doc(verify=["best_ckpt"]))
    for i, case in enumerate(sorted(CASES)):
        jdir = tmp_path / str(i)
        (jdir / "ckpt").mkdir(parents=True)
        best = jdir / "ckpt" / "best.pt"
        best.write_bytes(CASES[case]())
        controller = checkpoint_problem(best)
        wrapper = checks.verify_artifacts(str(jdir), spec)
        assert wrapper == ("" if controller is None else f"finalize: {best}: {controller}"), case
