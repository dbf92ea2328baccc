"""Queue-file parsing (docs/queue.md): the grammar, every worked example, and property tests."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.errors import QueueIssue, QueueParseError
from orchestrator.core.specs import JobSpec, ParsedQueue
from orchestrator.queue.queuefile import ALLOWED_KEYS, parse_bytes, parse_queue

CONFIGS = (
    "configs/a.yaml",
    "configs/z.yaml",
    "configs/ablation/baseline.yaml",
    "configs/ablation/no_aug.yaml",
    "configs/det/baseline.yml",
    "configs/det/baseline.yaml",
    "configs/recon/baseline.yaml",
    "configs/Base.yaml",
    "configs/x/base.yaml",
    "configs/exp#2.yaml",
    "configs/a.json",
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A workdir with every config file the worked examples name (content: a YAML comment)."""
    for rel in CONFIGS:
        target = tmp_path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"# {rel}\nlr: 0.1\n")
    return tmp_path


def parse_text(project: Path, text: str, **kwargs: object) -> ParsedQueue:
    queue = project / "q.txt"
    queue.write_bytes(text.encode("utf-8"))
    return parse_queue(queue, **kwargs)  # type: ignore[arg-type]


def errors_of(project: Path, text: str, **kwargs: object) -> list[QueueIssue]:
    with pytest.raises(QueueParseError) as info:
        parse_text(project, text, **kwargs)
    return info.value.issues


def only_message(project: Path, text: str, **kwargs: object) -> str:
    issues = errors_of(project, text, **kwargs)
    assert len(issues) == 1, issues
    return issues[0].message


def only_job(project: Path, text: str) -> JobSpec:
    parsed = parse_text(project, text)
    assert len(parsed.jobs) == 1
    return parsed.jobs[0]


# ---------------------------------------------------------------- worked examples (docs/queue.md)


def test_example_01_legacy_line(project: Path) -> None:
    job = only_job(project, "configs/ablation/baseline.yaml reconstruction 20\n")
    assert (job.name, job.task, job.epochs, job.gpus, job.nodes) == ("baseline", "reconstruction", 20, 1, 1)
    assert job.config == "configs/ablation/baseline.yaml"
    assert job.line == 1
    assert job.raw == "configs/ablation/baseline.yaml reconstruction 20"
    expected = hashlib.sha256((project / job.config).read_bytes()).hexdigest()
    assert job.config_sha256 == expected
    assert (job.est_min, job.seed, job.host, job.retries) == (None, None, None, None)


def test_example_02_tabs_and_default_epochs(project: Path) -> None:
    job = only_job(project, "configs/ablation/no_aug.yaml\t\tsegmentation\n")
    assert (job.name, job.task, job.epochs) == ("no_aug", "segmentation", 20)


def test_example_03_fields(project: Path) -> None:
    job = only_job(project, "configs/det/baseline.yml detection 50 name=det_baseline gpus=2\n")
    assert (job.name, job.epochs, job.gpus, job.task) == ("det_baseline", 50, 2, "detection")


def test_example_04_comments_and_blank_lines_are_not_jobs(project: Path) -> None:
    parsed = parse_text(project, "   # recon jobs first\n \t \n\nconfigs/a.yaml recon\n")
    assert [job.line for job in parsed.jobs] == [4]


def test_example_05_trailing_comment(project: Path) -> None:
    job = only_job(project, "configs/a.yaml recon 20   # rerun of a\n")
    assert (job.name, job.epochs) == ("a", 20)
    assert job.raw == "configs/a.yaml recon 20   # rerun of a"


def test_example_06_hash_inside_token_is_literal(project: Path) -> None:
    issues = errors_of(project, "configs/a.yaml recon 20#note\n")
    assert issues == [QueueIssue(1, 22, 'epochs must be a positive integer, got "20#note"')]


def test_example_07_crlf(project: Path) -> None:
    job = only_job(project, "configs/a.yaml recon 20\r\n")
    assert (job.name, job.epochs, job.raw) == ("a", 20, "configs/a.yaml recon 20")


def test_example_08_no_final_newline(project: Path) -> None:
    parsed = parse_text(project, "configs/a.yaml recon\nconfigs/z.yaml recon")
    assert [(job.name, job.epochs, job.line) for job in parsed.jobs] == [("a", 20, 1), ("z", 20, 2)]


@pytest.mark.parametrize(
    ("epochs", "message"),
    [
        ("0", 'epochs must be a positive integer, got "0"'),
        ("12.5", 'epochs must be a positive integer, got "12.5"'),
        ("-5", 'epochs must be a positive integer, got "-5"'),
        ("+5", 'epochs must be a positive integer, got "+5"'),
        ("2O", 'epochs must be a positive integer, got "2O"'),
        ("00", 'epochs must be a positive integer, got "00"'),
        ("\uff12\uff10", 'epochs must be a positive integer, got "\uff12\uff10"'),
        ("020", 'epochs must not have leading zeros, got "020"'),  # example 10
    ],
)
def test_examples_09_10_bad_epochs(project: Path, epochs: str, message: str) -> None:
    issues = errors_of(project, f"configs/a.yaml recon {epochs}\n")
    assert issues == [QueueIssue(1, 22, message)]


@pytest.mark.parametrize(
    ("line", "issue"),
    [
        ("configs/a.yaml", QueueIssue(1, None, "missing task")),
        ("configs/a.yaml name=a", QueueIssue(1, 16, 'missing task ("name=a" is a key=value field)')),
        (
            "name=a configs/a.yaml recon",
            QueueIssue(1, 1, 'missing config path ("name=a" is a key=value field)'),
        ),
    ],
)
def test_example_11_missing_task(project: Path, line: str, issue: QueueIssue) -> None:
    assert errors_of(project, line + "\n") == [issue]


def test_example_12_only_fields_after_epochs(project: Path) -> None:
    issues = errors_of(project, "configs/a.yaml recon 20 40\n")
    assert issues == [QueueIssue(1, 25, 'unexpected token "40": only key=value fields may follow epochs')]


def test_positional_after_a_field_is_an_error(project: Path) -> None:
    message = only_message(project, "configs/a.yaml recon gpus=2 40\n")
    assert message.startswith('unexpected token "40": only key=value fields may follow')


def test_example_13_multi_node(project: Path) -> None:
    job = only_job(project, "configs/a.yaml recon gpus=4 nodes=2 est_min=90\n")
    assert (job.name, job.epochs, job.gpus, job.nodes, job.est_min) == ("a", 20, 4, 2, 90.0)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("gpus=0", 'gpus must be an integer from 1 to 64, got "0"'),  # example 14
        ("gpus=65", 'gpus must be an integer from 1 to 64, got "65"'),
        ("gpus=-1", 'gpus must be an integer from 1 to 64, got "-1"'),
        ("gpus=02", 'gpus must not have leading zeros, got "02"'),
        ("nodes=0", 'nodes must be an integer from 1 to 64, got "0"'),
        ("seed=4294967296", 'seed must be an integer from 0 to 4294967295, got "4294967296"'),
        ("seed=1.5", 'seed must be an integer from 0 to 4294967295, got "1.5"'),
        ("retries=11", 'retries must be an integer from 0 to 10, got "11"'),
        ("est_min=0", 'est_min must be a number of minutes greater than 0 (like 90 or 37.5), got "0"'),
        ("est_min=1e3", 'est_min must be a number of minutes greater than 0 (like 90 or 37.5), got "1e3"'),
        (
            "name=-x",
            'name must be 1 to 64 characters from [A-Za-z0-9._-] starting with a letter or digit, got "-x"',
        ),
        (
            "lr=0.1",  # example 15
            'unknown key "lr" (allowed: name, gpus, nodes, est_min, seed, seeds, host, retries, gpu, gpu_mem, rerun, '
            'after)',
        ),
        ("name=", 'empty value for "name"; omit the field to use the default'),  # example 17
        ("gpus=", 'empty value for "gpus"; omit the field to use the default'),
    ],
)
def test_examples_14_15_17_bad_fields(project: Path, field: str, message: str) -> None:
    issues = errors_of(project, f"configs/a.yaml recon 20 {field}\n")
    assert issues == [QueueIssue(1, 25, message)]


def test_example_16_duplicate_key(project: Path) -> None:
    issues = errors_of(project, "configs/a.yaml recon 20 gpus=2 gpus=4\n")
    assert issues == [QueueIssue(1, 32, 'duplicate key "gpus"')]


def test_example_18_name_collision(project: Path) -> None:
    lines = ["# header", "", "configs/recon/baseline.yaml reconstruction 20"]
    lines += [f"configs/a.yaml recon name=filler{i}" for i in range(4, 9)]
    lines += ["configs/det/baseline.yaml detection 50"]
    with pytest.raises(QueueParseError) as info:
        parse_text(project, "\n".join(lines) + "\n")
    assert info.value.issues == [
        QueueIssue(
            9,
            None,
            'job name "baseline" collides with line 3 (configs/recon/baseline.yaml); '
            "add name= to one of them",
        )
    ]
    assert info.value.issues[0].render("q.txt").startswith('q.txt:9: job name "baseline" collides')


def test_example_19_case_insensitive_collision(project: Path) -> None:
    text = "# x\nconfigs/Base.yaml recon\n\n# y\nconfigs/x/base.yaml recon\n"
    issues = errors_of(project, text)
    assert issues == [
        QueueIssue(5, None, 'job name "base" collides with line 2 ("Base"; names are case-insensitive)')
    ]


def test_collision_with_explicit_name(project: Path) -> None:
    issues = errors_of(project, "configs/a.yaml recon\nconfigs/z.yaml recon name=A\n")
    message = 'job name "A" collides with line 1 ("a"; names are case-insensitive)'
    assert issues == [QueueIssue(2, None, message)]


def test_example_20_bad_derived_name(project: Path) -> None:
    issues = errors_of(project, "configs/exp#2.yaml recon\n")
    assert issues == [
        QueueIssue(1, 1, 'derived name "exp#2" has characters outside [A-Za-z0-9._-]; add name=')
    ]
    job = only_job(project, "configs/exp#2.yaml recon name=exp2\n")
    assert (job.name, job.config) == ("exp2", "configs/exp#2.yaml")


DOTDOT = 'config path must not contain ".."; it must stay inside the project root'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("/home/me/configs/a.yaml recon", "config path must be relative to the project root"),
        ("configs\\win\\a.yaml recon", 'config path uses "\\"; write it with "/"'),
        ("configs/missing.yaml recon", "config file not found: configs/missing.yaml"),  # example 22
        ("configs recon", "config path is not a regular file: configs"),
        ("configs/a.yaml/x.yaml recon", "config file not found: configs/a.yaml/x.yaml"),
        ("configs/ recon name=c", 'config path must name a file, got "configs/"'),
        ("../a.yaml recon", DOTDOT),
        ("configs/../configs/a.yaml recon", DOTDOT),
    ],
)
def test_examples_21_22_config_paths(project: Path, line: str, message: str) -> None:
    assert errors_of(project, line + "\n") == [QueueIssue(1, 1, message)]


def test_example_23_unknown_host(project: Path) -> None:
    text = "configs/a.yaml recon 20 host=box-7\n"
    issues = errors_of(project, text, known_hosts={"box-1", "box-2"})
    assert issues == [QueueIssue(1, 25, 'unknown host "box-7"')]
    assert parse_text(project, text, known_hosts={"box-7"}).jobs[0].host == "box-7"
    assert parse_text(project, text).jobs[0].host == "box-7"  # None = not checked


def test_example_24_seed_and_retries(project: Path) -> None:
    job = only_job(project, "configs/a.yaml recon 20 seed=42 retries=0\n")
    assert (job.name, job.seed, job.retries) == ("a", 42, 0)


def test_example_25_only_yaml_suffixes_are_stripped(project: Path) -> None:
    assert only_job(project, "configs/a.json recon\n").name == "a.json"
    assert only_job(project, "configs/det/baseline.yml recon\n").name == "baseline"


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n\n \t\n# another", "\ufeff"])
def test_example_26_no_jobs(project: Path, text: str) -> None:
    with pytest.raises(QueueParseError) as info:
        parse_text(project, text)
    assert info.value.issues == [QueueIssue(0, None, "no jobs")]
    assert str(info.value).splitlines()[0] == f"{project / 'q.txt'}: no jobs"


# ---------------------------------------------------------------- file-wide behaviour


def test_all_errors_at_once_in_line_order(project: Path) -> None:
    text = (
        "configs/a.yaml recon 0\n"
        "configs/z.yaml recon\n"
        "configs/missing.yaml recon\n"
        "# fine\n"
        "configs/ablation/baseline.yaml recon 20 lr=1\n"
    )
    issues = errors_of(project, text)
    assert [(issue.line, issue.message) for issue in issues] == [
        (1, 'epochs must be a positive integer, got "0"'),
        (3, "config file not found: configs/missing.yaml"),
        (5, 'unknown key "lr" (allowed: name, gpus, nodes, est_min, seed, seeds, host, retries, gpu, gpu_mem, rerun, '
            'after)'),
    ]


def test_several_errors_on_one_line_are_all_reported(project: Path) -> None:
    issues = errors_of(project, "configs/missing.yaml recon 0 gpus=0 seed=x\n")
    assert [issue.column for issue in issues] == [1, 28, 30, 37]


def test_rendered_format_with_column(project: Path) -> None:
    lines = [f"configs/ablation/baseline.yaml r name=j{i}" for i in range(1, 7)]
    lines.append("configs/a.yaml x 2O")
    with pytest.raises(QueueParseError) as info:
        parse_text(project, "\n".join(lines) + "\n")
    label = str(project / "q.txt")
    assert info.value.issues == [QueueIssue(7, 18, 'epochs must be a positive integer, got "2O"')]
    assert info.value.issues[0].render("q.txt") == 'q.txt:7:18: epochs must be a positive integer, got "2O"'
    assert str(info.value).splitlines() == [
        f'{label}:7:18: epochs must be a positive integer, got "2O"',
        f"1 error in {label}; nothing was submitted",
    ]


def test_label_is_the_path_as_given(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project)
    (project / "q.txt").write_text("configs/a.yaml recon 0\n")
    with pytest.raises(QueueParseError) as info:
        parse_queue(Path("q.txt"))
    assert str(info.value).splitlines()[0] == 'q.txt:1:22: epochs must be a positive integer, got "0"'
    parsed = parse_text(project, "configs/a.yaml recon\n")
    assert parsed.path == str(project / "q.txt")
    assert Path(parsed.workdir) == project


def test_missing_queue_file(tmp_path: Path) -> None:
    with pytest.raises(QueueParseError) as info:
        parse_queue(tmp_path / "nope.txt")
    assert info.value.issues == [QueueIssue(0, None, "cannot read queue file: No such file or directory")]


def test_queue_path_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(QueueParseError) as info:
        parse_queue(tmp_path)
    assert info.value.issues[0].line == 0
    assert info.value.issues[0].message.startswith("cannot read queue file: ")


def test_bom_is_dropped(project: Path) -> None:
    queue = project / "q.txt"
    queue.write_bytes(b"\xef\xbb\xbfconfigs/a.yaml recon 20\r\n")
    job = parse_queue(queue).jobs[0]
    assert (job.name, job.config, job.raw) == ("a", "configs/a.yaml", "configs/a.yaml recon 20")


def test_bom_before_a_comment(project: Path) -> None:
    queue = project / "q.txt"
    queue.write_bytes(b"\xef\xbb\xbf# comment\nconfigs/a.yaml recon\n")
    assert [job.line for job in parse_queue(queue).jobs] == [2]


def test_mixed_crlf_and_lf(project: Path) -> None:
    parsed = parse_text(project, "configs/a.yaml recon\r\nconfigs/z.yaml recon 3\n# c\r\n")
    assert [(job.name, job.epochs) for job in parsed.jobs] == [("a", 20), ("z", 3)]


@pytest.mark.parametrize(
    ("text", "issue"),
    [
        ("configs/a.yaml\rrecon\n", QueueIssue(1, 15, "stray carriage return")),
        ("configs/a.yaml recon\r\r\n", QueueIssue(1, 21, "stray carriage return")),
        ("configs/a.yaml recon\n# c\rd\n", QueueIssue(2, 4, "stray carriage return")),
    ],
)
def test_stray_carriage_return(project: Path, text: str, issue: QueueIssue) -> None:
    assert errors_of(project, text) == [issue]


def test_tabs_and_whitespace_runs(project: Path) -> None:
    job = only_job(project, "\t configs/a.yaml \t recon\t\t7 \tgpus=2\t\n")
    assert (job.config, job.task, job.epochs, job.gpus) == ("configs/a.yaml", "recon", 7, 2)


def test_hash_inside_a_name_is_literal_and_invalid(project: Path) -> None:
    issues = errors_of(project, "configs/a.yaml re#con 5 name=a#1 # real comment\n")
    assert [(issue.column, issue.message.split(",")[0]) for issue in issues] == [
        (25, "name must be 1 to 64 characters from [A-Za-z0-9._-] starting with a letter or digit")
    ]


def test_hash_inside_task_token(project: Path) -> None:
    job = only_job(project, "configs/a.yaml re#con 5 # real comment\n")
    assert (job.task, job.epochs) == ("re#con", 5)


def test_hash_at_line_start_is_comment(project: Path) -> None:
    parsed = parse_text(project, "#configs/z.yaml recon\nconfigs/a.yaml recon\n")
    assert [job.name for job in parsed.jobs] == ["a"]


def test_line_too_long(project: Path) -> None:
    text = "configs/a.yaml recon\n# " + "x" * 4095 + "\n"
    assert errors_of(project, text) == [QueueIssue(2, None, "line is longer than 4096 bytes")]
    ok = "configs/a.yaml recon #" + "x" * (4096 - 22) + "\n"
    assert len(ok.encode()) == 4097  # 4096 bytes of line plus LF
    assert only_job(project, ok).name == "a"
    crlf = ok.replace("\n", "\r\n")
    assert only_job(project, crlf).name == "a"


def test_invalid_utf8(project: Path) -> None:
    queue = project / "q.txt"
    queue.write_bytes(b"configs/a.yaml recon\nconfigs/\xc3\xa9\xff.yaml recon\n")
    with pytest.raises(QueueParseError) as info:
        parse_queue(queue)
    assert info.value.issues == [
        QueueIssue(2, 10, "invalid UTF-8 (byte 0xff); queue files must be UTF-8 text")
    ]


def test_non_ascii_text_is_fine(project: Path) -> None:
    (project / "configs" / "été.yaml").write_text("a: 1\n")
    job = only_job(project, "configs/été.yaml recon name=ete\n")
    assert job.config == "configs/été.yaml"


def test_control_character(project: Path) -> None:
    issues = errors_of(project, "configs/a.yaml re\x00con\n")
    assert issues == [QueueIssue(1, 18, "control character U+0000 is not allowed")]


def test_unknown_epochs_key_hint(project: Path) -> None:
    message = only_message(project, "configs/a.yaml recon epochs=5\n")
    assert message.startswith('unknown key "epochs" (allowed: ')
    assert "third token" in message


def test_derived_name_edge_cases(project: Path) -> None:
    (project / "configs" / ".hidden.yaml").write_text("a: 1\n")
    long = "x" * 65
    (project / "configs" / f"{long}.yaml").write_text("a: 1\n")
    assert only_message(project, "configs/.hidden.yaml r\n") == (
        'derived name ".hidden" must start with a letter or digit; add name='
    )
    assert only_message(project, f"configs/{long}.yaml r\n") == (
        f'derived name "{long}" is longer than 64 characters; add name='
    )
    assert only_job(project, f"configs/{long}.yaml r name=short\n").name == "short"
    (project / "configs" / "a.yaml.yaml").write_text("a: 1\n")
    assert only_job(project, "configs/a.yaml.yaml r\n").name == "a.yaml"


def test_tasks_check(project: Path) -> None:
    text = "configs/a.yaml x 20\n"
    assert errors_of(project, text, tasks=["b", "a"]) == [
        QueueIssue(1, 16, 'unknown task "x" (the payload declares: a, b)')
    ]
    assert parse_text(project, text, tasks=[]).jobs[0].task == "x"
    assert parse_text(project, text, tasks=None).jobs[0].task == "x"
    assert parse_text(project, text, tasks=("x",)).jobs[0].task == "x"


def test_symlink_escape_is_refused(project: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret.yaml"
    outside.write_text("a: 1\n")
    os.symlink(outside, project / "configs" / "evil.yaml")
    os.symlink(outside.parent, project / "configs" / "evil_dir")
    assert errors_of(project, "configs/evil.yaml r\nconfigs/evil_dir/secret.yaml r\n") == [
        QueueIssue(1, 1, "config path configs/evil.yaml leads outside the project root through a symlink"),
        QueueIssue(
            2, 1, "config path configs/evil_dir/secret.yaml leads outside the project root through a symlink"
        ),
    ]


def test_symlink_inside_is_followed(project: Path) -> None:
    os.symlink(project / "configs" / "a.yaml", project / "configs" / "alias.yaml")
    job = only_job(project, "configs/alias.yaml r\n")
    assert job.config == "configs/alias.yaml"
    assert job.config_sha256 == hashlib.sha256((project / "configs" / "a.yaml").read_bytes()).hexdigest()


def test_symlink_loop(project: Path) -> None:
    os.symlink("loop.yaml", project / "configs" / "loop.yaml")
    message = only_message(project, "configs/loop.yaml r\n")
    assert message.startswith("cannot read config file configs/loop.yaml: ")


def test_epochs_warning(project: Path) -> None:
    (project / "configs" / "e30.yaml").write_text("epochs: 30\nlr: 0.1\n")
    (project / "configs" / "e20.yaml").write_text("epochs: 20\n")
    (project / "configs" / "broken.yaml").write_text("epochs: [30\n")
    (project / "configs" / "list.yaml").write_text("- epochs\n")
    text = "configs/e30.yaml r\nconfigs/e30.yaml r 30 name=b\nconfigs/e20.yaml r\n"
    text += "configs/broken.yaml r\nconfigs/list.yaml r\nconfigs/e20.yaml r 5 name=c\n"
    parsed = parse_text(project, text)
    label = str(project / "q.txt")
    assert parsed.warnings == (f"{label}:6: config configs/e20.yaml sets epochs: 20 but the queue line runs 5",)
    # a line without epochs runs its config's (issue 39 item 2); without a usable one, the default
    assert [job.epochs for job in parsed.jobs] == [30, 30, 20, 20, 20, 5]


def test_a_line_without_epochs_never_overrides_the_configs(project: Path) -> None:
    """``configs/no_aug.yaml classify gpus=2`` with ``epochs: 6`` in the config runs 6, and says nothing
    about "the queue line" (which gave none); a config whose epochs: is unusable gets the default, said so."""
    (project / "configs" / "e6.yaml").write_text("epochs: 6\n")
    (project / "configs" / "odd.yaml").write_text("epochs: six\n")
    parsed = parse_text(project, "configs/e6.yaml classify gpus=2 est_min=2\nconfigs/odd.yaml classify\n")
    assert [job.epochs for job in parsed.jobs] == [6, 20]
    label = str(project / "q.txt")
    assert parsed.warnings == (f"{label}:2: config configs/odd.yaml sets epochs: six but gpuq runs the default 20",)


def test_workdir_none_skips_environment() -> None:
    parsed = parse_bytes(b"configs/nowhere.yaml recon 3\n", label="q.txt", workdir=None)
    job = parsed.jobs[0]
    assert (job.name, job.config_sha256, parsed.workdir) == ("nowhere", "", "")


def test_syntax_checks_still_apply_without_workdir() -> None:
    with pytest.raises(QueueParseError) as info:
        parse_bytes(b"../a.yaml recon\n", label="q.txt", workdir=None)
    assert info.value.issues[0].message.startswith("config path must not contain")


def test_same_config_twice_with_names(project: Path) -> None:
    parsed = parse_text(project, "configs/a.yaml r 10 name=a10\nconfigs/a.yaml r 20 name=a20\n")
    assert [job.name for job in parsed.jobs] == ["a10", "a20"]
    assert parsed.jobs[0].config_sha256 == parsed.jobs[1].config_sha256


def test_est_min_decimal(project: Path) -> None:
    assert only_job(project, "configs/a.yaml r est_min=37.5\n").est_min == 37.5
    assert only_job(project, "configs/a.yaml r est_min=0.5\n").est_min == 0.5


def test_boundaries_accepted(project: Path) -> None:
    job = only_job(project, "configs/a.yaml r 1 gpus=64 nodes=64 seed=4294967295 retries=10\n")
    assert (job.epochs, job.gpus, job.nodes, job.seed, job.retries) == (1, 64, 64, 4294967295, 10)
    job = only_job(project, "configs/a.yaml r seed=0 gpus=1\n")
    assert (job.seed, job.gpus) == (0, 1)


# ---------------------------------------------------------------- property tests

SINGLE_CHARS = " \t\n\r#=/\\.07-x\ufeff\x00é🙂\xff"  # "\xff" stands for a raw 0xff byte below
WORDS = ["\r\n", "..", "020", "configs/a.yaml", "recon", "20", "lr=", *(f"{key}=" for key in ALLOWED_KEYS)]
GRAMMAR_PIECES = st.sampled_from([*SINGLE_CHARS, *WORDS])


def assert_only_queue_errors(data: bytes, workdir: Path | None) -> None:
    try:
        parsed = parse_bytes(data, label="q.txt", workdir=workdir, known_hosts={"h"}, tasks={"recon"})
    except QueueParseError as err:
        assert err.issues
        assert all(issue.line >= 0 for issue in err.issues)
        assert [issue.line for issue in err.issues] == sorted(issue.line for issue in err.issues)
        str(err)
    else:
        assert parsed.jobs


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "configs").mkdir()
    (root / "configs" / "a.yaml").write_text("epochs: 30\n")
    (root / "configs" / "b.yaml").write_bytes(b"\xff: [\n")
    os.symlink("/", root / "configs" / "root")
    return root


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_queue_errors(data: bytes) -> None:
    assert_only_queue_errors(data, None)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_queue_errors(text: str) -> None:
    assert_only_queue_errors(text.encode("utf-8", "surrogatepass"), None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pieces=st.lists(GRAMMAR_PIECES, max_size=40), prefix_bom=st.booleans())
def test_grammar_soup_raises_only_queue_errors(fuzz_root: Path, pieces: list[str], prefix_bom: bool) -> None:
    data = "".join(pieces).encode("utf-8").replace("\xff".encode(), b"\xff")
    if prefix_bom:
        data = b"\xef\xbb\xbf" + data
    assert_only_queue_errors(data, fuzz_root)
    assert_only_queue_errors(data, None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_with_workdir(fuzz_root: Path, data: bytes) -> None:
    assert_only_queue_errors(data, fuzz_root)


NAME_START = "abcXYZ019"
NAME_CHARS = "abcXYZ019._-"
names = st.builds(
    lambda head, tail: head + tail,
    st.sampled_from(NAME_START),
    st.text(alphabet=NAME_CHARS, max_size=20),
)
segments = st.text(alphabet="abcz09_-", min_size=1, max_size=8)
config_paths = st.builds(
    lambda dirs, stem, suffix: "/".join([*dirs, stem + suffix]),
    st.lists(segments, max_size=3),
    names,
    st.sampled_from([".yaml", ".yml", ".json", ""]),
)
tasks = st.text(alphabet="abcRZ09_-#=./", min_size=1, max_size=12).filter(
    # a standalone "--" starts the trainer arguments: it is never a task
    lambda t: not t.startswith("#") and re.match(r"[a-z_]+=", t) is None and t != "--"
)
separators = st.text(alphabet=" \t", min_size=1, max_size=3)


def plain_int(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=low, max_value=high)


field_values: dict[str, st.SearchStrategy[object]] = {
    "name": names,
    "gpus": plain_int(1, 64),
    "nodes": plain_int(1, 64),
    "est_min": st.one_of(
        plain_int(1, 10_000),
        st.builds(lambda a, b: float(f"{a}.{b}"), plain_int(0, 999), plain_int(1, 9)),
    ),
    "seed": plain_int(0, 4294967295),
    "host": st.text(alphabet="abc-019.", min_size=1, max_size=10),
    "retries": plain_int(0, 10),
}


def derived_name(config: str) -> str:
    base = config.rsplit("/", 1)[-1]
    for suffix in (".yaml", ".yml"):
        if base.endswith(suffix):
            return base[: -len(suffix)]
    return base


@st.composite
def valid_lines(draw: st.DrawFn) -> tuple[str, dict[str, object]]:
    config = draw(config_paths)
    task = draw(tasks)
    epochs = draw(st.none() | plain_int(1, 10**6))
    keys = draw(st.lists(st.sampled_from(sorted(field_values)), unique=True))
    fields = {key: draw(field_values[key]) for key in keys}
    stem = derived_name(config)
    tokens = [config, task] + ([str(epochs)] if epochs is not None else [])
    tokens += [f"{key}={value}" for key, value in fields.items()]
    seps = [draw(separators) for _ in tokens]
    line = draw(st.sampled_from(["", " ", "\t"]))
    line += "".join(token + sep for token, sep in zip(tokens, seps, strict=True))[: -len(seps[-1])]
    line += draw(st.sampled_from(["", " # note", "\t#", "  #x=1 y"]))
    expected: dict[str, object] = {
        "config": config,
        "task": task,
        "epochs": epochs if epochs is not None else 20,
        "name": fields.get("name", stem),
        "gpus": fields.get("gpus", 1),
        "nodes": fields.get("nodes", 1),
        "est_min": float(fields["est_min"]) if "est_min" in fields else None,  # type: ignore[arg-type]
        "seed": fields.get("seed"),
        "host": fields.get("host"),
        "retries": fields.get("retries"),
        "raw": line,
    }
    return line, expected


@settings(max_examples=200, deadline=None)
@given(valid_lines(), st.sampled_from(["", "\n", "\r\n"]), st.booleans())
def test_valid_line_round_trips(case: tuple[str, dict[str, object]], eol: str, bom: bool) -> None:
    line, expected = case
    data = ("\ufeff" if bom else "") + "# header\n\n" + line + eol
    parsed = parse_bytes(data.encode("utf-8"), label="q.txt", workdir=None)
    assert len(parsed.jobs) == 1
    job = parsed.jobs[0]
    got = job.model_dump(include=set(expected))
    assert got == expected
    assert job.line == 3
