"""What the agent sees of a trainer that does not follow gpuq's payload contract: its progress in
the log, and the glob rule its ``run`` globs (checkpoint, outputs) are matched with (gpuq_own.py
decides what they match: the job's own files).

Everything here is read-only and bounded: a probe reads at most PROGRESS_TAIL_BYTES of a log and
walks at most MAX_WALK_ENTRIES entries of a run dir, so ``status --json`` stays fast with 100 jobs.
Symlinks are never followed or matched (the run dir links the project's read-only files).

stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import re
from typing import Any

from gpuq_base.gpuq_lazyre import lazy
from gpuq_base import gpuq_protocol as P

PROGRESS_TAIL_BYTES = 64 * 1024
MAX_LINE_CHARS = 4096  # a longer line is matched on its last part only (hostile or binary logs)
MAX_WALK_ENTRIES = 20000
LINE_SHOWN_CHARS = 200

_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
TQDM = lazy(r"(?:\|\s*|^\s*)(\d+)/(\d+)\s*\[")  # " 12%|###   | 12/100 [00:01<00:09, ...]"
RICH = lazy("[\u2501\u2578\u257a\u2500]\\s+(\\d+)/(\\d+)\\b")  # Lightning's Rich bar: "━━━╸━━ 12/50 0:00:01"
# gpuq's own lines in a job's log (the wrapper's header, its notes): never the trainer's last line
OWN_LINE = lazy(r"^(?:=== gpuq\b.*===\s*$|gpuq: )")
EPOCH = lazy(r"\bepoch\b\s*[:=#]?\s*(\d+)(?:\s*(?:/|of)\s*(\d+))?", re.IGNORECASE)
STEP = lazy(r"\b(?:global_)?step\b\s*[:=#]?\s*(\d+)(?:\s*(?:/|of)\s*(\d+))?", re.IGNORECASE)
LOSS = lazy(r"\b(?:train_)?loss\b\s*[:=]?\s*(" + _NUM + r")\b", re.IGNORECASE)
# Lightning's Rich bar: "Epoch 2/2 ━━━━╸━━ 4/8 0:00:01 ..." numbers epochs from 0 up to max_epochs - 1
# and counts the batches of that epoch (rich_progress.py: f"Epoch {current_epoch}/{max_epochs - 1}")
LIGHTNING_RICH = lazy("\\bEpoch (\\d+)/(\\d+)\\s*[\u2501\u2578\u257a\u2500]+\\s*(\\d+)/(\\d+)\\b")
_CONTROL = lazy(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_ANSI = lazy(r"\x1b\[[0-9;?]*[A-Za-z]")


# --- progress ------------------------------------------------------------------------


def read_tail(path: str, limit: int = PROGRESS_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a file as text ("" when unreadable); a cut first line is dropped."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            start = max(0, size - limit)
            f.seek(start)
            data = f.read(limit)
    except OSError:
        return ""
    if start > 0:
        cut = max(data.find(b"\n"), data.find(b"\r"))
        data = data[cut + 1:] if cut >= 0 else data
    return data.decode("utf-8", "replace")


def clean_line(line: str) -> str:
    """A log line fit to show: escape sequences and control characters gone, <= 200 chars."""
    line = _ANSI.sub("", line).replace("\t", " ")
    line = _CONTROL.sub("", line).strip()
    return line[-LINE_SHOWN_CHARS:] if len(line) > LINE_SHOWN_CHARS else line


def _lines(text: str) -> list[str]:
    """The trainer's log lines, newest last; tqdm's carriage-return redraws count as lines; gpuq's
    own lines (the wrapper's header) are left out."""
    out = []
    for ln in re.split(r"[\r\n]+", text):
        if ln.strip() and not OWN_LINE.match(_ANSI.sub("", ln).strip()):
            out.append(ln[-MAX_LINE_CHARS:])
    return out


def _to_int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        try:
            f = float(str(value).strip())
        except (TypeError, ValueError):
            return None
        return int(f) if f == f and abs(f) != float("inf") else None


def _to_float(value: Any) -> float | None:
    try:
        f = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    return f if f == f and abs(f) != float("inf") else None


def compile_progress(pattern: Any) -> Any:
    """The project's progress regex, or None (absent, or not a valid regex: the common forms apply)."""
    if not isinstance(pattern, str) or not pattern:
        return None
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _from_regex(lines: list[str], rx: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    names = [n for n in ("epoch", "step", "total", "loss") if n in rx.groupindex]
    for line in reversed(lines):
        m = rx.search(line)
        if m is None:
            continue
        for name in names:
            if name not in found and m.group(name) is not None:
                found[name] = m.group(name)
        if len(found) == len(names):
            break
    return found


def _lightning_bar(lines: list[str]) -> dict[str, Any]:
    """Progress from the newest of Lightning's Rich epoch bars, in gpuq's terms: 1-based epochs of the
    whole run (``Epoch 2/2`` is the third of 3) and steps of the whole run (the epoch's batches times
    the epochs before it: Lightning's global step).  {} when no line is one."""
    for line in reversed(lines):
        m = LIGHTNING_RICH.search(_ANSI.sub("", line))
        if m is None:
            continue
        index, last, batch, batches = (int(g) for g in m.groups())
        if batches <= 0 or index > last:
            return {}
        return {"epoch": index + 1, "epochs": last + 1, "step": index * batches + batch,
                "total": (last + 1) * batches}
    return {}


def _from_patterns(lines: list[str]) -> tuple[dict[str, Any], str | None]:
    found: dict[str, Any] = _lightning_bar(lines)
    source = "lightning" if found else None
    for line in reversed(lines):
        if "step" not in found:
            m = TQDM.search(line) or RICH.search(_ANSI.sub("", line))
            if m is not None:
                found["step"], found["total"] = m.group(1), m.group(2)
                source = source or "tqdm"
        if "step" not in found:
            m = STEP.search(line)
            if m is not None:
                found["step"] = m.group(1)
                if m.group(2) is not None:
                    found["total"] = m.group(2)
                source = source or "pattern"
        if "epoch" not in found:
            m = EPOCH.search(_ANSI.sub("", line))
            if m is not None:
                found["epoch"] = m.group(1)
                if m.group(2) is not None:
                    found["epochs"] = m.group(2)
                source = source or "pattern"
        if "loss" not in found:
            m = LOSS.search(line)
            if m is not None:
                found["loss"] = m.group(1)
        if "step" in found and "epoch" in found and "loss" in found:
            break
    return found, source


def parse_progress(text: str, pattern: Any = None) -> dict[str, Any] | None:
    """Progress from a log's tail: the project's regex (named groups epoch/step/total/loss) first,
    else tqdm's ``12/100``, ``epoch 3`` / ``Epoch 3/10``, ``step 1200``.  None for an empty log."""
    lines = _lines(text)
    if not lines:
        return None
    rx = pattern if hasattr(pattern, "search") else compile_progress(pattern)
    found: dict[str, Any] = {}
    source = None
    if rx is not None:
        found = _from_regex(lines, rx)
        source = "regex" if found else None
    if not found:
        found, source = _from_patterns(lines)
    step, total = _to_int(found.get("step")), _to_int(found.get("total"))
    epoch, epochs = _to_int(found.get("epoch")), _to_int(found.get("epochs"))
    pct = None
    if step is not None and total:
        pct = round(min(100.0, max(0.0, 100.0 * step / total)), 1)
    elif epoch is not None and total and step is None:  # a regex whose "total" counts epochs
        pct = round(min(100.0, max(0.0, 100.0 * epoch / total)), 1)
    elif epoch is not None and epochs:
        pct = round(min(100.0, max(0.0, 100.0 * epoch / epochs)), 1)
    return {"step": step, "total": total, "epoch": epoch, "epochs": epochs,
            "loss": _to_float(found.get("loss")), "pct": pct,
            "line": clean_line(lines[-1]), "source": source}


def job_progress(log_path: str, pattern: Any = None) -> dict[str, Any] | None:
    return parse_progress(read_tail(log_path), pattern)


# --- the run dir's globs ----------------------------------------------------------------


def glob_regex(pattern: str) -> Any:
    """A POSIX glob relative to the run dir as a regex: ``*`` and ``?`` stay inside one path
    component, ``**`` spans any number of them (``a/**`` = everything under a/)."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append(r"(?:[^/]*/)*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(r".*")
            i += 2
            continue
        if c == "*":
            out.append(r"[^/]*")
        elif c == "?":
            out.append(r"[^/]")
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end > i + 1:
                body = pattern[i + 1:end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body + "]")
                i = end + 1
                continue
            out.append(re.escape(c))
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def safe_globs(globs: Any) -> list[str]:
    """The usable globs of a spec field: strings, relative, no ``..`` component."""
    if isinstance(globs, str):
        globs = [globs]
    if not isinstance(globs, (list, tuple)):
        return []
    out = []
    for g in globs:
        if not isinstance(g, str) or not g.strip() or g.startswith("/"):
            continue
        g = g.strip()
        while g.startswith("./"):
            g = g[2:]
        if ".." in g.split("/") or not g:
            continue
        out.append(g)
    return out


def run_dir_of(job_dir: str) -> str:
    return os.path.join(job_dir, P.RUN_DIR)
