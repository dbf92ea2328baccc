"""The agent's patterns compiled on first use (payload/agent/gpuq_base/gpuq_lazyre.py): the same answers as
``re.compile``, and nothing compiled before a method is called (each agent call is a fresh interpreter)."""

from __future__ import annotations

import re

from tests.support.agentmodule import load_agent_module

lazyre = load_agent_module("gpuq_base.gpuq_lazyre")
scan = load_agent_module("gpuq_watch.gpuq_scan")


def test_a_lazy_pattern_compiles_on_first_use_and_answers_as_re_does() -> None:
    pat = lazyre.lazy(r"\bstep\b\s*[:=]?\s*(\d+)", re.IGNORECASE)
    assert pat._compiled is None and pat.pattern == r"\bstep\b\s*[:=]?\s*(\d+)"
    ref = re.compile(r"\bstep\b\s*[:=]?\s*(\d+)", re.IGNORECASE)
    text = "x STEP = 12 and step:7"
    m = pat.search(text)
    assert m is not None and m.group(1) == "12" and pat._compiled is not None
    assert [g.group(1) for g in pat.finditer(text)] == [g.group(1) for g in ref.finditer(text)]
    assert pat.findall(text) == ref.findall(text) and pat.split(text) == ref.split(text)
    assert pat.sub("_", text) == ref.sub("_", text)
    assert pat.match(text) is None and pat.match(text, 2) is not None
    assert pat.fullmatch("step 3") is not None and pat.search(text, 0, 5) is None


def test_importing_the_scanner_compiles_none_of_its_signatures() -> None:
    pending = [p for _, p in scan.SIGNATURES]
    fresh = [p for p in pending if p._compiled is None]
    assert fresh, "every signature was compiled at import"  # this process may have scanned before
    hits = [name for name, p in scan.SIGNATURES if p.search("RuntimeError: CUDA out of memory. Tried")]
    assert hits == ["cuda_oom"]
