"""Queue lines with trainer arguments after `--`: shell-like splitting, grids, seeds, names (docs/queue.md)."""

from __future__ import annotations

import hashlib

import pytest

from orchestrator.core.errors import QueueIssue, QueueParseError
from orchestrator.core.specs import JobSpec, job_id_for, spec_hash_for
from orchestrator.queue.queuefile import parse_bytes


def jobs(text: str, **kwargs: object) -> list[JobSpec]:
    return list(parse_bytes(text.encode(), label="q.txt", workdir=None, **kwargs).jobs)  # type: ignore[arg-type]


def issues(text: str, **kwargs: object) -> list[QueueIssue]:
    with pytest.raises(QueueParseError) as info:
        jobs(text, **kwargs)
    return info.value.issues


def test_arguments_after_a_standalone_double_dash_pass_verbatim() -> None:
    (job,) = jobs("configs/base.yaml classify 10 gpus=2 -- --lr 3e-4 model.width=256 +x=~y\n")
    assert (job.config, job.task, job.epochs, job.gpus) == ("configs/base.yaml", "classify", 10, 2)
    assert job.args == ("--lr", "3e-4", "model.width=256", "+x=~y")
    assert job.name == job.cell == "base"


def test_quotes_escapes_and_comments_split_like_a_shell() -> None:
    line = """a.yaml t -- 'a b' "c \\"d\\" $HOME" e\\ f g#h "#i" # j k\n"""
    (job,) = jobs(line)
    assert job.args == ("a b", 'c "d" $HOME', "e f", "g#h", "#i")


def test_a_line_without_arguments_keeps_its_old_identity() -> None:
    (old,) = jobs("a.yaml t 3\n")
    assert old.args == () and spec_hash_for(old) == spec_hash_for(JobSpec(name="a", config="a.yaml", task="t",
                                                                           epochs=3))
    (with_args,) = jobs("a.yaml t 3 -- --lr 1\n")
    assert spec_hash_for(with_args) != spec_hash_for(old)


def test_grid_expands_to_the_cartesian_product_with_readable_names() -> None:
    got = jobs("name=lr gpus=2 -- --lr {1e-3,3e-4} --seed {1,2,3}\n", needs_config=False)
    assert [j.name for j in got] == ["lr-lr1e-3-seed1", "lr-lr1e-3-seed2", "lr-lr1e-3-seed3",
                                     "lr-lr3e-4-seed1", "lr-lr3e-4-seed2", "lr-lr3e-4-seed3"]
    assert got[4].args == ("--lr", "3e-4", "--seed", "2")
    assert {j.cell for j in got} == {"lr"} and {j.gpus for j in got} == {2}
    assert got[0].config == "" and got[0].task == ""


def test_group_keys_come_from_the_flag_the_dotted_key_or_nothing() -> None:
    got = jobs("a.yaml t -- optim.lr={0.1,0.2} --wd={0,1} {small,large}\n")
    assert [j.name for j in got][:3] == ["a-lr0.1-wd0-small", "a-lr0.1-wd0-large", "a-lr0.1-wd1-small"]
    assert got[0].args == ("optim.lr=0.1", "--wd=0", "small")


def test_literal_braces_interpolations_and_quoted_groups_do_not_expand() -> None:
    (job,) = jobs("a.yaml t -- \\{a,b} '{c,d}' \"{e,f}\" ${oc.env:X,1} ${a.{b,c}} {1} '{x}' {open\n")
    assert job.args == ("{a,b}", "{c,d}", "{e,f}", "${oc.env:X,1}", "${a.{b,c}}", "{1}", "{x}", "{open")
    assert job.name == "a"


def test_a_group_inside_a_word_keeps_the_rest_of_the_word() -> None:
    got = jobs("a.yaml t -- model=resnet{18,50}\n")
    assert [(j.name, j.args) for j in got] == [("a-model18", ("model=resnet18",)), ("a-model50", ("model=resnet50",))]


def test_seeds_repeat_the_cell_with_seeds_from_zero() -> None:
    got = jobs("a.yaml t seeds=3 -- --lr {1,2}\n")
    assert [(j.name, j.seed) for j in got] == [("a-lr1-seed0", 0), ("a-lr1-seed1", 1), ("a-lr1-seed2", 2),
                                               ("a-lr2-seed0", 0), ("a-lr2-seed1", 1), ("a-lr2-seed2", 2)]


def test_unsafe_characters_and_long_names() -> None:
    (one, _) = jobs("a.yaml t -- --opt {a/b,c:d}\n")
    assert one.name == "a-opta_b"
    long = "x" * 60
    got = jobs(f"name={long} -- --lr {{1,2}}\n", needs_config=False)
    assert got[0].name == f"{long}-lr1"  # exactly 64: kept
    got = jobs(f"name={long} -- --learning_rate {{1,2}}\n", needs_config=False)
    full = f"{long}-learning_rate1"
    assert got[0].name == full[:55] + "-" + hashlib.sha256(full.encode()).hexdigest()[:8]
    assert len(got[0].name) == 64 and got[0].name != got[1].name


def test_names_and_ids_are_stable_across_edits_of_other_lines() -> None:
    first = jobs("name=g -- --lr {1,2}\n", needs_config=False)
    second = jobs("# added\nname=other -- x\nname=g -- --lr {1,2}\n", needs_config=False)
    assert [j.name for j in first] == [j.name for j in second if j.cell == "g"]
    assert job_id_for("qabc", first[0].name) == job_id_for("qabc", "g-lr1")


def test_errors_name_the_line_and_column() -> None:
    assert issues("a.yaml t -- 'open\n") == [QueueIssue(1, 13, "unterminated single quote")]
    assert issues('a.yaml t -- x "open\n') == [QueueIssue(1, 15, "unterminated double quote")]
    assert issues("a.yaml t -- x\\\n") == [QueueIssue(1, 14, "trailing backslash; write \\\\ for a literal one")]
    assert issues("a.yaml t -- {a,{b,c}}\n") == [QueueIssue(
        1, 13, "a grid group inside a grid group is not supported; write \\{ for a literal brace")]


def test_a_flag_before_the_double_dash_gets_a_hint() -> None:
    assert issues("a.yaml t 3 --lr=1\n") == [QueueIssue(
        1, 12, 'unexpected token "--lr=1": only key=value fields may follow epochs; trainer arguments go after a '
        'standalone "--"')]


def test_arguments_only_lines_need_a_name_and_the_project_s_permission() -> None:
    assert issues("gpus=2 -- 50 10\n", needs_config=False) == [
        QueueIssue(1, None, "a line without a config path needs name= (job ids derive from names)")]
    assert issues("name=x gpus=2 -- 50 10\n") == [
        QueueIssue(1, 1, 'missing config path ("name=x" is a key=value field)')]
    assert issues("-- 50 10\n") == [
        QueueIssue(1, None, 'missing config path ("--" starts the trainer arguments)')]
    (job,) = jobs("name=bs32 gpus=2 -- 50 10 --batch_size 32\n", needs_config=False)
    assert job.args == ("50", "10", "--batch_size", "32") and job.name == "bs32"


def test_expansion_limits_and_collisions() -> None:
    values = ",".join(str(v) for v in range(40))
    assert issues(f"a.yaml t seeds=30 -- {{{values}}}\n") == [
        QueueIssue(1, None, "line expands to 1200 jobs, more than 1000; split it into several lines")]
    assert issues("a.yaml t seeds=1001\n") == [
        QueueIssue(1, 10, 'seeds must be an integer from 1 to 1000, got "1001"')]
    assert issues("a.yaml t seeds=2 seed=1\n") == [
        QueueIssue(1, None, "seed= and seeds= cannot both be set (seeds=N runs seeds 0 to N-1)")]
    assert issues("a.yaml t -- {1,1}\n") == [QueueIssue(
        1, None, 'the grid expands to two jobs named "a-1"; give the values distinct names (see docs/queue.md) '
        "or split the line")]
    assert issues("a.yaml t -- {x,y}\nb.yaml c name=a-x\n") == [
        QueueIssue(2, None, 'job name "a-x" collides with line 1 (a.yaml); add name= to one of them')]


def test_ten_thousand_jobs_parse() -> None:
    digits = ",".join(str(v) for v in range(10))
    text = "".join(f"name=c{i} -- --a {{{digits}}} --b {{{digits}}} --c {{{digits}}}\n" for i in range(10))
    got = jobs(text, needs_config=False)
    assert len(got) == 10_000 and len({j.name.casefold() for j in got}) == 10_000
