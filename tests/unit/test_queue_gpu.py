"""`gpu=` and `gpu_mem=` on a queue line (docs/queue.md, "GPU model and memory"): parsed into the job
spec and the ledger's job row, every problem at the column of what is at fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.errors import QueueParseError
from orchestrator.core.specs import JobSpec, spec_hash_for
from orchestrator.ledger import Ledger
from orchestrator.queue.queuefile import parse_bytes


def _parse(text: str) -> tuple[JobSpec, ...]:
    return parse_bytes(text.encode(), label="q.txt", workdir=None).jobs


def _problems(text: str) -> list[str]:
    with pytest.raises(QueueParseError) as caught:
        _parse(text)
    return [issue.render("q.txt") for issue in caught.value.issues]


def test_models_and_memory_reach_the_spec() -> None:
    (job,) = _parse("a.yaml t gpu=A100|H100 gpu_mem=79.5\n")
    assert (job.gpu, job.gpu_mem) == (("A100", "H100"), 79.5)
    (plain,) = _parse("a.yaml t\n")
    assert (plain.gpu, plain.gpu_mem) == ((), None)
    assert spec_hash_for(job) == spec_hash_for(plain)  # hardware places a job; it is not what the job is
    (one,) = _parse("name=x gpu_mem=40 gpu=rtx-4090 -- run\n".replace("name=x ", "a.yaml t name=x "))
    assert (one.gpu, one.gpu_mem) == (("rtx-4090",), 40.0)


@pytest.mark.parametrize(("line", "expected"), [
    ("a.yaml t gpu=A100||H100", 'q.txt:1:19: empty GPU model in gpu=; join models with one "|" (gpu=A100|H100)'),
    ("a.yaml t gpu=|A100", 'q.txt:1:14: empty GPU model in gpu=; join models with one "|" (gpu=A100|H100)'),
    ("a.yaml t gpu=A100|", 'q.txt:1:19: empty GPU model in gpu=; join models with one "|" (gpu=A100|H100)'),
    ("a.yaml t gpu=A100|H1*0", 'q.txt:1:21: GPU model "H1*0" has "*"; a model is letters, digits and "._-"'),
    ("a.yaml t 5 gpu=A100,H100", 'q.txt:1:20: GPU model "A100,H100" has ","; a model is letters, digits and "._-"'),
    ("a.yaml t gpu=A100|--", 'q.txt:1:19: GPU model "--" has no letter or digit'),
    ("a.yaml t gpu=" + "|".join("ABCDEFGHIJKLMNOPQ"), "q.txt:1:10: gpu= lists 17 models, more than 16"),
    ("a.yaml t gpu=", 'q.txt:1:10: empty value for "gpu"; omit the field to use the default'),
    ("a.yaml t gpu=A100 gpu=H100", 'q.txt:1:19: duplicate key "gpu"'),
    ("a.yaml t gpu_mem=80GB", 'q.txt:1:10: gpu_mem must be GB of memory per GPU, greater than 0 and at most 4096 '
                              '(like 24 or 80), got "80GB"'),
    ("a.yaml t gpu_mem=0", 'q.txt:1:10: gpu_mem must be GB of memory per GPU, greater than 0 and at most 4096 '
                           '(like 24 or 80), got "0"'),
    ("a.yaml t gpu_mem=4097", 'q.txt:1:10: gpu_mem must be GB of memory per GPU, greater than 0 and at most 4096 '
                              '(like 24 or 80), got "4097"'),
    ("a.yaml t gpu_mem=-1", 'q.txt:1:10: gpu_mem must be GB of memory per GPU, greater than 0 and at most 4096 '
                            '(like 24 or 80), got "-1"'),
])
def test_each_problem_is_reported_at_its_column(line: str, expected: str) -> None:
    assert _problems(line + "\n") == [expected]


def test_every_problem_of_the_file_is_reported_at_once() -> None:
    text = "a.yaml t gpu=A100|\tgpu_mem=x\nb.yaml t gpu=ok\n\tc.yaml t gpu=é\n"
    assert _problems(text) == [
        'q.txt:1:19: empty GPU model in gpu=; join models with one "|" (gpu=A100|H100)',
        'q.txt:1:20: gpu_mem must be GB of memory per GPU, greater than 0 and at most 4096 (like 24 or 80), '
        'got "x"',
        'q.txt:3:15: GPU model "é" has "é"; a model is letters, digits and "._-"',
    ]


def test_the_ledger_keeps_what_a_job_needs(tmp_path: Path) -> None:
    jobs = _parse("a.yaml t gpu=A100|H100 gpu_mem=40\nb.yaml t\n")
    ledger = Ledger(tmp_path / "ledger.db")
    try:
        rows = ledger.add_sweep(sweep_id="qabcdef", queue_path="q.txt", workdir=str(tmp_path), queue_text="",
                                jobs=jobs, default_retries=2)
        kept = {j.name: (j.gpu, j.gpu_mem) for j in (ledger.job(r.id) for r in rows)}
    finally:
        ledger.close()
    assert kept == {"a": ("A100|H100", 40.0), "b": ("", None)}
