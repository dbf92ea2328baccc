"""Unit tests of the payload's atomic checkpoint writer and verified loader."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "payload"))

from gpuq_payload import ConfigError, checkpoint, contract, grace  # noqa: E402


def _state(step: int) -> dict:
    return {"model": {"w": torch.arange(64, dtype=torch.float32) * step}, "step": step}


def test_save_writes_complete_file_and_matching_pointer(tmp_path: Path) -> None:
    doc = checkpoint.save_checkpoint(_state(3), str(tmp_path), step=3, epoch=1)
    pointer = json.loads((tmp_path / contract.LATEST_POINTER).read_text())
    assert pointer == doc
    assert set(pointer) == {"file", "step", "epoch", "sha256", "bytes", "written_at"}
    path = tmp_path / pointer["file"]
    assert pointer["file"] == checkpoint.rolling_name(3) == "latest-000000003.pt"
    assert pointer["sha256"] == checkpoint.sha256_file(str(path))
    assert pointer["bytes"] == path.stat().st_size
    assert not list(tmp_path.glob("*.tmp"))
    loaded = checkpoint.load_checkpoint(str(path), pointer["sha256"])
    assert torch.equal(loaded["model"]["w"], _state(3)["model"]["w"])


def test_leftover_tmp_is_deleted_and_never_selected(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(_state(5), str(tmp_path), step=5, epoch=0)
    name = checkpoint.rolling_name(5)
    good = (tmp_path / name).read_bytes()
    # a torn write of the next checkpoint: truncated latest-*.pt.tmp and a half-written LATEST.tmp
    torn = checkpoint.rolling_name(6) + ".tmp"
    (tmp_path / torn).write_bytes(good[: len(good) // 3])
    (tmp_path / (contract.LATEST_POINTER + ".tmp")).write_text('{"file": "latest-6.pt.tmp", "st')
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    assert os.path.basename(path) == name
    assert checkpoint.load_checkpoint(path, sha)["step"] == 5
    removed = checkpoint.cleanup_tmp(str(tmp_path))
    assert sorted(removed) == sorted([torn, contract.LATEST_POINTER + ".tmp"])
    assert not list(tmp_path.glob("*.tmp"))
    assert (tmp_path / name).read_bytes() == good


def test_the_file_the_pointer_names_is_never_rewritten(tmp_path: Path) -> None:
    """A kill at any point of a save leaves LATEST naming a complete file with its sha256: the next
    checkpoint goes to a new name, the pointer moves, and only then the old file goes."""
    first = checkpoint.save_checkpoint(_state(1), str(tmp_path), step=1, epoch=0)
    before = (tmp_path / first["file"]).read_bytes()
    second = checkpoint.save_checkpoint(_state(2), str(tmp_path), step=2, epoch=0)
    assert second["file"] != first["file"] and not (tmp_path / first["file"]).exists()
    assert sorted(p.name for p in tmp_path.glob("latest*.pt")) == [second["file"]]
    # the window between the new file and the pointer: the old pointer still verifies its own file
    (tmp_path / first["file"]).write_bytes(before)
    checkpoint.write_pointer(str(tmp_path), first)
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    assert checkpoint.load_checkpoint(path, sha)["step"] == 1


def test_pointer_to_tmp_file_is_rejected(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(_state(1), str(tmp_path), step=1, epoch=0)
    doc = json.loads((tmp_path / contract.LATEST_POINTER).read_text())
    doc["file"] = doc["file"] + ".tmp"
    (tmp_path / contract.LATEST_POINTER).write_text(json.dumps(doc))
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.resolve_resume(str(tmp_path), None)


def test_load_rejects_sha_mismatch(tmp_path: Path) -> None:
    checkpoint.save_checkpoint(_state(2), str(tmp_path), step=2, epoch=0)
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    with pytest.raises(checkpoint.CheckpointError, match="sha256 mismatch"):
        checkpoint.load_checkpoint(path, "0" * 64)
    with open(path, "r+b") as fh:  # flip one byte of the real file
        fh.seek(10)
        byte = fh.read(1)
        fh.seek(10)
        fh.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(checkpoint.CheckpointError, match="sha256 mismatch"):
        checkpoint.load_checkpoint(path, sha)


def test_no_pointer_means_fresh_start_and_explicit_resume(tmp_path: Path) -> None:
    assert checkpoint.resolve_resume(str(tmp_path), None) is None
    with pytest.raises(checkpoint.CheckpointError):
        checkpoint.resolve_resume(str(tmp_path), str(tmp_path / "missing.pt"))
    checkpoint.save_checkpoint(_state(4), str(tmp_path), step=4, epoch=0)
    for target in (tmp_path, tmp_path / contract.LATEST_POINTER, tmp_path / checkpoint.rolling_name(4)):
        path, sha = checkpoint.resolve_resume(str(tmp_path / "elsewhere"), str(target))
        assert checkpoint.load_checkpoint(path, sha)["step"] == 4


def test_best_loads_with_weights_only_and_weights_hash_is_stable(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    sd = checkpoint.unwrap_state_dict(model)
    checkpoint.save_best({"model": sd, "metrics": {"val_acc": 0.5, "kind": "eval"}, "step": 1}, str(tmp_path))
    best = torch.load(tmp_path / contract.BEST_CKPT, weights_only=True)
    assert best["metrics"]["val_acc"] == 0.5
    assert checkpoint.weights_sha256(best["model"]) == checkpoint.weights_sha256(sd)
    sd2 = {k: v.clone() for k, v in sd.items()}
    sd2["bias"][0] += 1.0
    assert checkpoint.weights_sha256(sd2) != checkpoint.weights_sha256(sd)


def test_a_second_save_at_the_pointed_step_never_rewrites_the_pointed_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A periodic save at an epoch's last step, then a SIGTERM during the eval: the final save has
    the same step.  It goes to another name, so a kill between its rename and the pointer cannot
    leave LATEST naming a file whose sha256 changed."""
    first = checkpoint.save_checkpoint(_state(8), str(tmp_path), step=8, epoch=0)
    renamed = []
    real_write = checkpoint._write_file_atomic

    def spy(obj, path, hook_step=None):
        pointed = checkpoint.read_pointer(str(tmp_path))["file"]
        assert os.path.basename(path) != pointed  # the file LATEST names is never the target
        renamed.append(os.path.basename(path))
        return real_write(obj, path, hook_step)

    monkeypatch.setattr(checkpoint, "_write_file_atomic", spy)
    second = checkpoint.save_checkpoint({**_state(8), "epoch": 1}, str(tmp_path), step=8, epoch=1)
    third = checkpoint.save_checkpoint(_state(8), str(tmp_path), step=8, epoch=1)
    assert renamed == ["latest-000000008-1.pt", "latest-000000008.pt"]  # toggles off the pointed name
    assert (first["file"], second["file"], third["file"]) == (
        "latest-000000008.pt", "latest-000000008-1.pt", "latest-000000008.pt")
    assert [p.name for p in tmp_path.glob("latest*.pt")] == [third["file"]]
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    assert checkpoint.load_checkpoint(path, sha)["step"] == 8


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing after the hook point runs (open files are closed, as the kernel would)."""


@pytest.mark.parametrize("point", contract.TEST_HOOK_SAVE_POINTS)
def test_a_save_killed_at_any_point_leaves_the_previous_checkpoint_selected(
        tmp_path: Path, point: str, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint.save_checkpoint(_state(1), str(tmp_path), step=1, epoch=0)
    good = checkpoint.read_pointer(str(tmp_path))

    def die(_seconds: float) -> None:
        raise _Killed

    monkeypatch.setenv(contract.ENV_TEST_HOOK_SAVE_PAUSE, f"{point}:1:2")
    monkeypatch.setattr(checkpoint.time, "sleep", die)
    with pytest.raises(_Killed):
        checkpoint.save_checkpoint(_state(2), str(tmp_path), step=2, epoch=0)
    assert checkpoint.read_pointer(str(tmp_path)) == good
    path, sha = checkpoint.resolve_resume(str(tmp_path), None)
    assert os.path.basename(path) == good["file"] and checkpoint.load_checkpoint(path, sha)["step"] == 1
    torn = {"write": ["latest-000000002.pt.tmp"], "fsynced": ["latest-000000002.pt.tmp"], "renamed": [],
            "pointer": ["LATEST.tmp"]}[point]
    if point == "write":  # a torn file: the hook held it after its first block
        with pytest.raises(Exception):  # noqa: B017 - any failure to load a torn file will do
            torch.load(tmp_path / torn[0], weights_only=True)
    assert checkpoint.cleanup_tmp(str(tmp_path)) == torn
    assert not list(tmp_path.glob("*.tmp"))
    # the next save (next attempt) succeeds and moves the pointer; nothing unpointed stays behind
    monkeypatch.delenv(contract.ENV_TEST_HOOK_SAVE_PAUSE)
    doc = checkpoint.save_checkpoint(_state(3), str(tmp_path), step=3, epoch=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([contract.LATEST_POINTER, doc["file"]])


def test_the_save_hook_only_holds_steps_from_its_threshold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = []
    monkeypatch.setenv(contract.ENV_TEST_HOOK_SAVE_PAUSE, "renamed:0.25:5")
    monkeypatch.setattr(checkpoint.time, "sleep", held.append)
    for step in (4, 5):
        checkpoint.save_checkpoint(_state(step), str(tmp_path), step=step, epoch=0)
    assert held == [0.25]
    checkpoint.save_best({"model": {"w": torch.zeros(2)}}, str(tmp_path))  # best.pt is never held
    assert held == [0.25]


# ---------------------------------------------------------------- the SIGTERM grace budget (grace.py)

def test_grace_absent_or_empty_is_unknown_and_bad_values_are_config_errors() -> None:
    assert grace.parse_grace(None) is None and grace.parse_grace("") is None and grace.parse_grace(" ") is None
    assert grace.parse_grace("5") == 5.0 and grace.parse_grace("0") == 0.0
    for bad in ("-1", "five", "nan"):
        with pytest.raises(ConfigError, match="GPUQ_SIGTERM_GRACE_S"):
            grace.parse_grace(bad)


def test_torchrun_caps_the_grace_at_its_own_shutdown_timeout() -> None:
    assert grace.effective_grace("120", {}) == 120.0  # a plain process: nobody else kills it
    assert grace.effective_grace("", {"TORCHELASTIC_RUN_ID": "x"}) is None
    assert grace.effective_grace("120", {"TORCHELASTIC_RUN_ID": "x"}) == 30.0  # torchrun's default
    assert grace.effective_grace("5", {"TORCHELASTIC_RUN_ID": "x"}) == 5.0
    env = {"TORCHELASTIC_RUN_ID": "x", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "90"}
    assert grace.effective_grace("120", env) == (90.0 if grace._torchrun_honours_shutdown_env() else 30.0)


def test_the_save_and_step_decisions() -> None:
    # RunPod spot (5 s): a 0.5 s save fits at once, not after 4 s
    assert grace.save_need(0.0, 0.5) == pytest.approx(0.5 * grace.SAFETY + grace.MARGIN_S)
    assert grace.save_need(0.0, 0.5) <= 5
    assert grace.save_need(4.0, 0.5) > 5
    # 1.5 s saves never fit 2 s, though 1.5 < 2: the safety factor and the margin
    assert grace.save_need(0.0, 1.5) > 2
    # finishing a 2 s step and a 0.5 s save fits 5 s only right after the signal
    assert grace.step_need(0.0, 2.0, 0.5) <= 5 < grace.step_need(1.5, 2.0, 0.5)
    # short steps are always finished (no mid-step agreement); unknown grace never abandons
    assert not grace.midstep_check(5.0, 0.01) and grace.midstep_check(5.0, 0.5)
    assert not grace.midstep_check(None, 10.0) and not grace.midstep_check(5.0, 0.0)
    assert not grace.midstep_check(0.0, 10.0)


def test_save_time_is_the_longest_recent_save_else_estimated_from_bytes() -> None:
    t = grace.Timings()
    assert t.measured_save_s() is None
    assert t.save_s(200_000_000) == pytest.approx(grace.ASSUMED_SAVE_OVERHEAD_S + 2.0)
    for took in (0.4, 0.1, 0.2, 0.3):  # only the last RECENT_SAVES (3) count
        t.add_save(took)
    assert t.save_s(10**12) == 0.3 and t.measured_save_s() == 0.3
    assert t.step_s() == 0.0
    for took in (0.05, 0.02):
        t.add_step(took)
    assert t.step_s() == 0.05


class _RunsCode:
    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, ("touch pwned",))


def test_a_checkpoint_that_would_run_code_is_refused_not_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint shipped from one host and pushed to another must not be able to run code there:
    it is loaded with weights_only=True (docs/security.md)."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "latest-000000008.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "step": 8, "hook": _RunsCode()}, path)
    with pytest.raises(checkpoint.CheckpointError, match="cannot load checkpoint"):
        checkpoint.load_checkpoint(str(path))
    assert not (tmp_path / "pwned").exists()


def test_the_full_training_state_loads_with_weights_only(tmp_path: Path) -> None:
    """RNG states (python, numpy, torch) are kept as tensors and plain values, and restore exactly."""
    import random

    from gpuq_payload import rng

    rng.seed_all(3)
    state = rng.capture()
    torch.save({"rng": [state]}, tmp_path / "c.pt")
    expected = (random.random(), torch.rand(2))
    loaded = checkpoint.load_checkpoint(str(tmp_path / "c.pt"))
    rng.restore(loaded["rng"][0])
    assert (random.random(), torch.rand(2))[0] == expected[0]
    rng.restore(loaded["rng"][0])
    assert torch.equal(torch.rand(2), expected[1])
    np = pytest.importorskip("numpy")
    rng.restore(loaded["rng"][0])
    first = np.random.rand()
    rng.restore(loaded["rng"][0])
    assert np.random.rand() == first


# --- what crosses ranks (issue 23 item 3): JSON in uint8 tensors, checked on arrival, never pickle ---


def test_an_rng_state_crosses_ranks_as_json_and_comes_back_the_same(tmp_path: Path) -> None:
    import random

    from gpuq_payload import rng
    from gpuq_payload.distributed import Dist
    rng.seed_all(11)
    random.gauss(0, 1)  # a cached gauss value travels too
    state = rng.capture()
    doc = json.loads(json.dumps(rng.to_doc(state)))
    back = rng.from_doc(Dist(10, False).gather_json(doc)[0])
    assert back["python"] == state["python"] and torch.equal(back["torch"], state["torch"])
    rng.restore(back)
    drawn = (random.random(), torch.rand(1).item())
    rng.restore(state)
    assert drawn == (random.random(), torch.rand(1).item())
    torch.save({"rng": [back]}, tmp_path / "c.pt")  # still loads with weights_only=True
    assert torch.load(tmp_path / "c.pt", weights_only=True)["rng"][0]["python"] == state["python"]


@pytest.mark.parametrize("bad", [
    None, [], {"python": [3, [0] * 625, None]}, {"python": [3, [0] * 624, None], "torch": "00"},
    {"python": [3, [0] * 624 + [2**32], None], "torch": "00"}, {"python": [3, [0] * 625, "x"], "torch": "00"},
    {"python": [3, [0] * 625, None], "torch": "zz"}, {"python": [3, [0] * 625, None], "torch": "00", "x": 1},
    {"python": [3, [0] * 625, None], "torch": "00", "numpy": ["MT19937", [0] * 3, 0, 0, 0.0]},
    {"python": [3, [0] * 625, None], "torch": "00", "cuda": ["00"] * 65},
    {"python": [3, [True] * 625, None], "torch": "00"},
])
def test_an_rng_state_of_the_wrong_shape_from_a_peer_is_refused(bad: object) -> None:
    from gpuq_payload import rng
    with pytest.raises(rng.RngDocError):
        rng.from_doc(bad)


def test_a_resume_choice_of_the_wrong_shape_is_refused() -> None:
    from gpuq_payload.trainstate import resume_choice
    assert resume_choice(None) is None
    assert resume_choice({"path": "/c/x.pt", "sha256": "ab"}) == {"path": "/c/x.pt", "sha256": "ab"}
    assert resume_choice({"error": "no such checkpoint"}) == {"error": "no such checkpoint"}
    for bad in ({}, [], "x", {"path": "/c/x.pt"}, {"path": 1, "sha256": "ab"}, {"path": "p", "sha256": "s", "x": "y"}):
        with pytest.raises(checkpoint.CheckpointError):
            resume_choice(bad)


def test_a_document_that_is_not_json_or_too_long_is_refused() -> None:
    from gpuq_payload import distributed
    with pytest.raises(distributed.PeerDocumentError, match="rank 1 sent a document that is not JSON"):
        distributed._decode(b"\x80\x04K\x01.", 1)  # a pickle is not JSON
    with pytest.raises(distributed.PeerDocumentError, match="rank 1 sent a document of"):
        distributed._check_lengths([10, distributed.MAX_DOC_BYTES + 1])
    with pytest.raises(distributed.PeerDocumentError):
        distributed._check_lengths([0])


def test_the_payload_calls_no_pickling_collective() -> None:
    payload = Path(__file__).resolve().parents[2] / "payload"
    for path in [*payload.joinpath("gpuq_payload").glob("*.py"), payload / "train.py"]:
        text = path.read_text()
        for name in ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
                     "send_object_list", "recv_object_list"):
            assert name not in text, f"{path.name} uses torch.distributed.{name} (it unpickles what peers send)"
