"""The [run] table of gpuq.toml: keys, template checks, job checks, setup_key (docs/your-project.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_settings
from orchestrator.errors import ConfigError
from orchestrator.runconfig import RunConfig, check_jobs, load_run, secrets_for, setup_key
from orchestrator.specs import JobSpec


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
