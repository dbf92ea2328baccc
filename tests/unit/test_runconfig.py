"""The [run] table of gpuq.toml: keys, template checks, job checks, setup_key (docs/your-project.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.config import load_settings
from orchestrator.core.errors import ConfigError
from orchestrator.core.specs import JobSpec
from orchestrator.queue.runconfig import (
    RunConfig,
    check_forward_allowed,
    check_jobs,
    is_allowed,
    load_run,
    never_forwarded,
    project_root,
    repository_root,
    secrets_for,
    setup_key,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gpuq.toml"
    path.write_text(text)
    return path


def test_without_a_run_table_nothing_changes(tmp_path: Path) -> None:
    assert load_run(tmp_path / "gpuq.toml") is None
    assert load_run(write(tmp_path, "retries = 1\n")) is None


def test_every_key_parses_and_strings_split_like_a_shell(tmp_path: Path) -> None:
    run = load_run(write(tmp_path, """retries = 3
[run]
project = "."
command = "train.py --out '{run_dir}/x y' {args}"
launcher = "none"
setup = "pip install -r requirements.txt"
env = { NCCL_DEBUG = "WARN" }
forward_env = ["WANDB_API_KEY"]
checkpoint = "snapshot.pt"
resume_args = "--resume {checkpoint}"
outputs = ["outputs/**", "*.json"]
metrics = "metrics.csv"
metric = "val_acc"
mode = "min"
progress = 'Epoch (?P<epoch>\\d+)'
"""))
    assert run is not None
    assert run.command == ("train.py", "--out", "{run_dir}/x y", "{args}")
    assert run.resume_args == ("--resume", "{checkpoint}") and run.checkpoint == ("snapshot.pt",)
    assert run.outputs == ("outputs/**", "*.json") and run.mode == "min" and run.verify == ()
    assert not run.needs_config and run.uses() == {"run_dir", "args", "checkpoint"}
    assert RunConfig().needs_config  # no command: the payload's own, which takes --config and --task
    settings = load_settings(env={"GPUQ_HOME": str(tmp_path / "h")}, project_dir=tmp_path)
    assert settings.retries == 3  # [run] is not an unknown setting


@pytest.mark.parametrize(("text", "message"), [
    ('[run]\ncommand = "train.py {args} --x {foo}"\n',
     "gpuq.toml:2:32: [run] command: unknown placeholder {foo}"),
    ('[run]\ncommand = ["train.py",\n  "--lr={lr"]\n', 'gpuq.toml:3:9: [run] command: unbalanced "{"'),
    ('[run]\nresume_args = "--r {args}"\n', "gpuq.toml:2:20: [run] resume_args: {args} is only allowed in the command"),
    ("[run]\nbogus = 1\n", "gpuq.toml: [run] unknown key 'bogus' (allowed: project, command,"),
    ('[run]\nforward_env = ["A-B"]\n', "gpuq.toml:2:1: [run] forward_env: Value error, 'A-B' is not an environment"),
    ('[run]\nlauncher = "mpirun"\n', "gpuq.toml:2:1: [run] launcher: Input should be 'torchrun', 'python' or 'none'"),
    ('[run]\nmetrics = "m.txt"\n', 'gpuq.toml:2:1: [run] metrics: Value error, must be "", "log", or a .csv'),
    ('[run]\nprogress = "(("\n', "gpuq.toml:2:1: [run] progress: Value error, not a valid regular expression"),
    ("[run]\ncommand = \"a 'b\"\n", "gpuq.toml:2:1: [run] command: Value error, cannot split like a shell"),
])
def test_errors_name_the_file_the_key_and_the_place(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_run(write(tmp_path, text))
    assert str(info.value).startswith(f"{tmp_path}/{message}"), str(info.value)


def test_job_checks_name_the_line_and_never_a_secret_value(tmp_path: Path) -> None:
    run = RunConfig(command=("train.py", "--seed", "{seed}", "--c", "{config}"), forward_env=("TOKEN", "OTHER"))
    jobs = [JobSpec(name="a", config="", task="", line=3)]
    errors = check_jobs(run, jobs, tmp_path / "gpuq.toml", "q.txt", environ={"TOKEN": "s3cret"})
    assert errors == [
        f"q.txt:3: job 'a' has no seed but [run] uses {{seed}} ({tmp_path}/gpuq.toml); add seed= or seeds= to the line",
        f"q.txt:3: job 'a' has no config but [run] command uses {{config}} ({tmp_path}/gpuq.toml); give the line "
        "a config path and task",
        f"{tmp_path}/gpuq.toml: [run] forward_env: OTHER is not set in this environment; export it before "
        "submitting (its value is sent to the hosts, never stored)",
    ]
    assert "s3cret" not in "".join(errors)
    assert secrets_for(["TOKEN"], {"TOKEN": "s3cret"}) == {"TOKEN": "s3cret"}
    with pytest.raises(ConfigError) as info:
        secrets_for(["OTHER"], {"TOKEN": "s3cret"})
    assert "OTHER" in str(info.value) and "s3cret" not in str(info.value)


def test_setup_key_follows_setup_env_and_dependency_files(tmp_path: Path) -> None:
    assert setup_key(RunConfig(), tmp_path) == ""
    run = RunConfig(setup="pip install -r deps/extra.txt", env={"A": "1"})
    (tmp_path / "deps").mkdir()
    (tmp_path / "deps" / "extra.txt").write_text("hydra-core\n")
    (tmp_path / "train.py").write_text("print(1)\n")
    first = setup_key(run, tmp_path)
    assert len(first) == 64
    (tmp_path / "train.py").write_text("print(2)\n")
    assert setup_key(run, tmp_path) == first  # code is not a dependency
    (tmp_path / "deps" / "extra.txt").write_text("hydra-core==1.3\n")
    second = setup_key(run, tmp_path)
    assert second != first
    (tmp_path / "requirements-dev.txt").write_text("x\n")
    third = setup_key(run, tmp_path)
    assert third != second
    assert setup_key(run.model_copy(update={"env": {"A": "2"}}), tmp_path) != third


@pytest.mark.parametrize("name", ["RUNPOD_API_KEY", "GPUQ_RUNPOD_API_KEY", "LAMBDA_API_KEY", "GPUQ_WEBHOOK_URL",
                                  "gpuq_lambda_api_key", "GPUQ_ANYTHING"])
def test_gpuqs_own_credentials_are_never_forwarded(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_run(write(tmp_path, f'[run]\nforward_env = ["WANDB_API_KEY", "{name}"]\n'))
    assert f"{tmp_path}/gpuq.toml:2:1: [run] forward_env: Value error, {name} is gpuq's" in str(info.value)
    assert never_forwarded(name) and not is_allowed(name, ["*", name])
    assert not never_forwarded("WANDB_API_KEY") and is_allowed("WANDB_API_KEY", ["WANDB_*"])


def test_forward_env_needs_the_users_allow_list(tmp_path: Path) -> None:
    run = RunConfig(forward_env=("WANDB_API_KEY", "HF_TOKEN"))
    check_forward_allowed(run, tmp_path / "gpuq.toml", ["WANDB_*", "HF_TOKEN"])
    with pytest.raises(ConfigError) as info:
        check_forward_allowed(run, tmp_path / "gpuq.toml", ["WANDB_API_KEY"], "/h/config.toml")
    assert str(info.value) == (
        f'{tmp_path}/gpuq.toml: [run] forward_env: HF_TOKEN is not in your forward_env_allow; if this project may '
        'send it to its hosts, add forward_env_allow = ["HF_TOKEN"] to /h/config.toml (or set '
        "GPUQ_FORWARD_ENV_ALLOW=HF_TOKEN); nothing was submitted")


def _tree(tmp_path: Path, vcs: str | None) -> Path:
    repo = tmp_path / "outer" / "repo"
    (repo / "sub" / "proj").mkdir(parents=True)
    (repo / "lib").mkdir()
    (tmp_path / "outer" / "private").mkdir()
    if vcs:
        (repo / vcs).mkdir()
    return repo


@pytest.mark.parametrize(("vcs", "project", "ok"), [
    (".git", "..", True),  # sub/proj -> sub: inside the repository
    (".git", "../../lib", True),
    (".hg", "../..", True),  # the repository's root itself
    (".git", "../../..", False),  # outer: holds the repository and another private project
    (".git", "../../../private", False),
    (None, ".", True),
    (None, "..", False),  # no repository: the gpuq.toml's own directory is the limit
    (None, "../../../../../../../../..", False),  # up to /
])
def test_the_project_root_stays_inside_the_repository(tmp_path: Path, vcs: str | None, project: str,
                                                       ok: bool) -> None:
    repo = _tree(tmp_path, vcs)
    toml_dir = repo / "sub" / "proj"
    run = RunConfig(project=project)
    if ok:
        assert project_root(run, toml_dir).is_relative_to(repo)
        return
    with pytest.raises(ConfigError) as info:
        project_root(run, toml_dir)
    assert str(info.value).startswith(f"{toml_dir}/gpuq.toml: [run] project: {project!r} is ")
    assert "outside the repository" in str(info.value)


def test_a_git_file_marks_a_repository_root_too(tmp_path: Path) -> None:
    repo = _tree(tmp_path, None)
    (repo / ".git").write_text("gitdir: /elsewhere\n")  # a worktree or submodule
    assert repository_root(repo / "sub" / "proj") == repo.resolve()
    assert repository_root(tmp_path) == tmp_path.resolve()


def test_home_root_and_gpuq_home_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = _tree(tmp_path, ".git")
    toml_dir = repo / "sub" / "proj"
    monkeypatch.setenv("HOME", str(repo))  # a dotfiles repository in $HOME: the repository is the home
    with pytest.raises(ConfigError) as info:
        project_root(RunConfig(project="../.."), toml_dir)
    assert "is your home directory" in str(info.value)
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError) as info:
        project_root(RunConfig(project=".."), toml_dir, gpuq_home=repo / "sub" / "state")
    assert "holds gpuq's state directory" in str(info.value)
    (repo / "sub" / "state" / "x").mkdir(parents=True)
    with pytest.raises(ConfigError, match="is inside gpuq's state directory"):
        project_root(RunConfig(project="../state/x"), toml_dir, gpuq_home=repo / "sub" / "state")
    assert project_root(RunConfig(project="../../lib"), toml_dir, gpuq_home=repo / "sub" / "state") == repo / "lib"
    (repo / "sub" / "loop").symlink_to(repo / "sub" / "loop")
    with pytest.raises(ConfigError):
        project_root(RunConfig(project="../loop"), toml_dir)


def test_the_filesystem_root_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.queue.runconfig as runconfig

    monkeypatch.setattr(runconfig, "repository_root", lambda toml_dir: Path("/"))  # a machine with /.git
    depth = len(tmp_path.resolve().parts) - 1
    with pytest.raises(ConfigError) as info:
        project_root(RunConfig(project="/".join([".."] * depth)), tmp_path)
    assert "is /; point it at the project's own directory" in str(info.value)


def test_a_gpuq_toml_that_is_not_utf8_is_one_config_error_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "gpuq.toml"
    path.write_bytes(b'[run]\ncommand = "python train.py \xff"\n')
    with pytest.raises(ConfigError, match=r"gpuq\.toml: not UTF-8 text \(byte 33\)"):
        load_run(path)
