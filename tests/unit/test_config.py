"""Settings precedence: defaults < user config < project gpuq.toml < GPUQ_* env < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.config import load_settings
from orchestrator.core.errors import ConfigError


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
    from orchestrator.core.config import load_profile, profiles_dir

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
    from orchestrator.core.config import load_profile

    with pytest.raises(ConfigError, match=r"unknown profile 'nope' \(known: .*local"):
        load_profile("nope")


@pytest.mark.parametrize("key", ["webhook_url", "local_python", "local_root", "forward_env_allow", "budget_usd_month"])
def test_a_project_cannot_set_what_only_the_user_may(tmp_path: Path, key: str) -> None:
    """A cloned repository's gpuq.toml must not redirect notifications or pick what runs locally."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "gpuq.toml").write_text(f'{key} = "https://attacker.example/x"\n')
    with pytest.raises(ConfigError, match=rf"gpuq.toml: {key} can only be set in your own .*config.toml or the "
                                          rf"environment \(GPUQ_{key.upper()}\)"):
        load_settings(env={"GPUQ_HOME": str(tmp_path / "home")}, project_dir=project)


@pytest.mark.parametrize(("url", "ok"), [
    ("https://hooks.example.com/x", True), ("http://127.0.0.1:8080/h", True), ("http://localhost/h", True),
    ("http://[::1]:9/h", True), ("http://hooks.example.com/x", False), ("http://10.0.0.5/h", False),
    ("ftp://x/y", False), ("https://", False),
])
def test_webhooks_need_https_unless_loopback(tmp_path: Path, url: str, ok: bool) -> None:
    env = {"GPUQ_HOME": str(tmp_path), "GPUQ_WEBHOOK_URL": url}
    if ok:
        assert load_settings(env=env).webhook_url == url
    else:
        with pytest.raises(ConfigError, match=r"GPUQ_WEBHOOK_URL: .*https://"):
            load_settings(env=env)


def test_config_toml_with_a_webhook_must_be_private(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('webhook_url = "https://hooks.example.com/s3cr3t"\n')
    config.chmod(0o644)
    with pytest.raises(ConfigError, match=r"readable or writable by others \(mode 0644\); run: chmod 600"):
        load_settings(env={"GPUQ_HOME": str(tmp_path)})
    config.chmod(0o600)
    assert load_settings(env={"GPUQ_HOME": str(tmp_path)}).webhook_url.endswith("s3cr3t")
    config.write_text("retries = 3\n")
    config.chmod(0o666)
    with pytest.raises(ConfigError, match=r"writable by others \(mode 0666\)"):
        load_settings(env={"GPUQ_HOME": str(tmp_path)})


@pytest.mark.parametrize(("value", "expected"), [
    ("metrics", ("metrics",)), ("metrics,best_ckpt", ("metrics", "best_ckpt")), ('["metrics"]', ("metrics",)),
    (" metrics , best_ckpt ", ("metrics", "best_ckpt")), ("", ()), ("[]", ()),
])
def test_list_settings_come_from_the_environment(tmp_path: Path, value: str, expected: tuple[str, ...]) -> None:
    assert load_settings(env={"GPUQ_HOME": str(tmp_path), "GPUQ_VERIFY": value}).verify == expected


def test_forward_env_allow_comes_from_the_user_alone(tmp_path: Path) -> None:
    """Which variables may leave this machine is the user's choice (their config.toml or environment)."""
    assert load_settings(env={"GPUQ_HOME": str(tmp_path)}).forward_env_allow == ()
    (tmp_path / "config.toml").write_text('forward_env_allow = ["WANDB_API_KEY", "HF_*"]\n')
    assert load_settings(env={"GPUQ_HOME": str(tmp_path)}).forward_env_allow == ("WANDB_API_KEY", "HF_*")
    env = {"GPUQ_HOME": str(tmp_path), "GPUQ_FORWARD_ENV_ALLOW": "A,B_*"}
    assert load_settings(env=env).forward_env_allow == ("A", "B_*")
    project = tmp_path / "proj"
    project.mkdir()
    (project / "gpuq.toml").write_text('forward_env_allow = ["*"]\n')
    with pytest.raises(ConfigError, match=r"gpuq.toml: forward_env_allow can only be set in your own"):
        load_settings(env={"GPUQ_HOME": str(tmp_path)}, project_dir=project)
    with pytest.raises(ConfigError, match=r"GPUQ_FORWARD_ENV_ALLOW: .*'A B' is not a variable name or a pattern"):
        load_settings(env={"GPUQ_HOME": str(tmp_path), "GPUQ_FORWARD_ENV_ALLOW": '["A B"]'})


def test_the_hosts_lease_is_on_by_default_and_the_users_alone(tmp_path: Path) -> None:
    """lease_timeout_min (the rented host stops its own billing): 30 by default, 0 = off, never a project's."""
    home = {"GPUQ_HOME": str(tmp_path / "home")}
    assert load_settings(env=home).lease_timeout_min == 30.0
    assert load_settings(env={**home, "GPUQ_LEASE_TIMEOUT_MIN": "0"}).lease_timeout_min == 0.0
    project = tmp_path / "proj"
    project.mkdir()
    (project / "gpuq.toml").write_text("lease_timeout_min = 0\n")  # a cloned project must not keep machines billing
    with pytest.raises(ConfigError, match=r"gpuq.toml: lease_timeout_min can only be set in your own"):
        load_settings(env=home, project_dir=project)
