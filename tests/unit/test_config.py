"""Settings precedence: defaults < user config < project gpuq.toml < GPUQ_* env < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ConfigError


def test_precedence(tmp_path: Path) -> None:
    home, project = tmp_path / "home", tmp_path / "proj"
    home.mkdir()
    project.mkdir()
    (home / "config.toml").write_text("heartbeat_s = 5\nretries = 3\nkill_grace_s = 7\n")
    (project / "gpuq.toml").write_text("[gpuq]\nretries = 4\nkill_grace_s = 8\n")
    env = {"GPUQ_HOME": str(home), "GPUQ_KILL_GRACE_S": "9"}
    s = load_settings(env=env, project_dir=project, overrides={"min_free_gb": 2.5})
    assert (s.heartbeat_s, s.retries, s.kill_grace_s, s.min_free_gb) == (5, 4, 9, 2.5)
    assert s.ledger_path == home / "ledger.db"
    assert s.local_host_root == home / "local"


def test_unknown_key_names_file(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("hartbeat_s = 5\n")
    with pytest.raises(ConfigError, match=r"config.toml: unknown setting 'hartbeat_s'"):
        load_settings(env={"GPUQ_HOME": str(tmp_path)})


def test_bad_env_value_names_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="GPUQ_RETRIES"):
        load_settings(env={"GPUQ_HOME": str(tmp_path), "GPUQ_RETRIES": "many"})


def test_empty_home_is_an_error_not_a_default(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set but empty"):
        load_settings(env={"GPUQ_HOME": ""})


def test_invalid_toml(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("heartbeat_s = = 5\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_settings(env={"GPUQ_HOME": str(tmp_path)})


def test_shipped_profiles_validate() -> None:
    from orchestrator.config import load_profile, profiles_dir

    names = [p.stem for p in profiles_dir().glob("*.toml")]
    assert "local" in names
    for name in names:
        assert load_profile(name).name == name


def test_local_profile_places_the_local_root(tmp_path: Path) -> None:
    s = load_settings(env={"GPUQ_HOME": str(tmp_path)})
    assert s.local_host_root == tmp_path / "local"
    assert load_settings(env={"GPUQ_HOME": str(tmp_path), "GPUQ_LOCAL_ROOT": "/srv/gpuq"}).local_host_root == Path(
        "/srv/gpuq")


def test_unknown_profile_lists_known_ones() -> None:
    from orchestrator.config import load_profile

    with pytest.raises(ConfigError, match=r"unknown profile 'nope' \(known: .*local"):
        load_profile("nope")
