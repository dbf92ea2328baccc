"""LocalHost runs commands with a fixed minimal environment, never the controller's own (docs/security.md):
with `--slurm local` that environment would reach sbatch and be stored with every job."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.hosts.local import INHERITED, LocalHost, command_env


def test_a_local_command_sees_only_the_fixed_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AWS_SECRET_ACCESS_KEY": "aws-secret", "RUNPOD_API_KEY": "rp-secret",
                        "GPUQ_WEBHOOK_URL": "https://hook.example/secret", "WANDB_API_KEY": "wb-secret",
                        "LC_TIME": "C", "SLURM_CONF": "/etc/slurm/x.conf", "HOME": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    out = LocalHost(tmp_path).run(["env"])
    assert out.exit_code == 0, out.stderr
    seen = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert "secret" not in out.stdout
    assert seen["LC_TIME"] == "C" and seen["SLURM_CONF"] == "/etc/slurm/x.conf" and seen["HOME"] == str(tmp_path)
    assert "PATH" in seen
    assert set(seen) - {"PWD", "SHLVL", "_"} <= set(INHERITED) | {k for k in seen if k.startswith("LC_")}


def test_the_environment_falls_back_to_a_plain_path() -> None:
    assert command_env({}) == {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert command_env({"USER": "u", "TOKEN": "t", "LC_ALL": "C.UTF-8"}) == {
        "USER": "u", "LC_ALL": "C.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin"}
