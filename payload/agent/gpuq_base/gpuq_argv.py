"""The trainer's command line, built from the project's command template (docs/your-project.md).

One implementation for both sides: the wrapper renders a job's argv on the host, and the controller
loads this same file (``orchestrator/core/agent_modules.py``) to validate templates at submit and to
print the exact argv in ``gpuq submit --dry-run``.  stdlib only, Python >= 3.8.

A template is a list of argv elements.  Inside an element, ``{name}`` is a placeholder from
``PLACEHOLDERS``; ``{{`` and ``}}`` are literal braces.  Substitution is per element: a value is
never re-split or given to a shell.  ``{args}`` stands for the line's trainer arguments and must be
a whole element; when a command has no ``{args}``, the arguments are appended at its end.
"""

# ruff: noqa: UP031  (%-formatting on purpose: one style for every Python >= 3.8 the agent meets)
from __future__ import annotations

import re
from typing import Sequence

PLACEHOLDERS = ("config", "task", "epochs", "name", "seed", "job_id", "attempt", "run_dir", "ckpt_dir",
                "checkpoint", "args", "master_port")
LINE_PLACEHOLDERS = ("config", "task", "epochs", "name", "seed", "job_id", "attempt", "run_dir", "ckpt_dir",
                     "master_port")  # those a queue line's own arguments may use (docs/queue.md)
LAUNCHERS = ("torchrun", "python", "none")
ARGS = "args"

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|data\.[A-Za-z_][A-Za-z0-9_]*")  # {data.NAME}: a [data] path


class TemplateError(ValueError):
    """A problem with one template element: ``index`` (0-based element) and ``column`` (1-based)."""

    def __init__(self, index: int, column: int, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.column = column
        self.message = message


def _parts(index: int, text: str) -> list[tuple[str, str]]:
    """Split one element into ("lit", text) and ("ph", name) parts; raise TemplateError."""
    parts: list[tuple[str, str]] = []
    lit: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "{" and text.startswith("{{", i):
            lit.append("{")
            i += 2
            continue
        if ch == "}" and text.startswith("}}", i):
            lit.append("}")
            i += 2
            continue
        if ch == "}":
            raise TemplateError(index, i + 1, 'unbalanced "}"; write "}}" for a literal brace')
        if ch == "{":
            end = text.find("}", i + 1)
            name = text[i + 1:end] if end > 0 else ""
            if end < 0 or not _NAME_RE.fullmatch(name):
                raise TemplateError(index, i + 1, 'unbalanced "{"; placeholders look like {name}, '
                                    'and "{{" is a literal brace')
            if name not in PLACEHOLDERS and not name.startswith("data."):
                raise TemplateError(index, i + 1, "unknown placeholder {%s} (known: %s)" % (
                    name, ", ".join("{%s}" % p for p in PLACEHOLDERS)))
            if lit:
                parts.append(("lit", "".join(lit)))
                lit = []
            parts.append(("ph", name))
            i = end + 1
            continue
        lit.append(ch)
        i += 1
    if lit:
        parts.append(("lit", "".join(lit)))
    return parts


def check(template: Sequence[str], *, allow_args: bool = True) -> list[TemplateError]:
    """Every problem of a template (empty list: fine)."""
    problems: list[TemplateError] = []
    seen_args = False
    for index, element in enumerate(template):
        if not isinstance(element, str):
            problems.append(TemplateError(index, 1, "argv elements must be strings"))
            continue
        try:
            parts = _parts(index, element)
        except TemplateError as exc:
            problems.append(exc)
            continue
        names = [p[1] for p in parts if p[0] == "ph"]
        if ARGS in names:
            column = element.find("{args}") + 1
            if not allow_args:
                problems.append(TemplateError(index, column, "{args} is only allowed in the command"))
            elif element != "{args}":
                problems.append(TemplateError(index, column, "{args} must be a whole argument on its own "
                                              "(it expands to several arguments)"))
            elif seen_args:
                problems.append(TemplateError(index, column, "{args} may appear only once"))
            seen_args = True
    return problems


def uses(template: Sequence[str]) -> set[str]:
    """The placeholder names a (valid) template uses."""
    out: set[str] = set()
    for index, element in enumerate(template):
        out.update(p[1] for p in _parts(index, element) if p[0] == "ph")
    return out


def render(template: Sequence[str], values: dict[str, str], args: Sequence[str] = (),
           *, append_args: bool = True) -> list[str]:
    """The argv for ``template``: placeholders replaced per element; ``{args}`` (or, when absent and
    ``append_args``, the end) receives ``args``.  A placeholder without a value is a TemplateError."""
    out: list[str] = []
    placed = False
    for index, element in enumerate(template):
        if element == "{args}":
            out.extend(args)
            placed = True
            continue
        pieces: list[str] = []
        for part in _parts(index, element):
            if part[0] == "lit":
                pieces.append(part[1])
            elif part[1] in values and values[part[1]] is not None:
                pieces.append(str(values[part[1]]))
            else:
                raise TemplateError(index, 1, "{%s} has no value for this job" % part[1])
        out.append("".join(pieces))
    if not placed and append_args:
        out.extend(args)
    return out


_LINE_RE = re.compile(r"\{(\{(%s)\})\}|\{(%s)\}" % ("|".join(LINE_PLACEHOLDERS), "|".join(LINE_PLACEHOLDERS)))


def render_args(args: Sequence[str], values: dict[str, str]) -> list[str]:
    """A queue line's arguments for this job: ``{name}`` (a name of ``LINE_PLACEHOLDERS``) is its value,
    ``{{name}}`` the literal text ``{name}``; every other character stays as it is (the controller's
    queuegrid.py writes literal ``{name}`` text doubled).  Never re-split, never given to a shell."""
    def one(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return match.group(1)
        return str(values.get(match.group(3)) or "")
    return [_LINE_RE.sub(one, str(arg)) for arg in args]


def launcher_prefix(launcher: str, python: str, nproc: int, extra: Sequence[str] = (),
                    rendezvous: Sequence[str] | None = None) -> list[str]:
    """What goes before the rendered command: torchrun (single node with its own free rendezvous port,
    or ``rendezvous``: one node of a multi-node job), the interpreter, or nothing."""
    if launcher == "torchrun":
        where = list(rendezvous) if rendezvous is not None else ["--standalone", "--nnodes=1"]
        return [python, "-m", "torch.distributed.run"] + where + ["--nproc-per-node=%d" % nproc] + list(extra)
    if launcher == "python":
        return [python]
    if launcher == "none":
        return []
    raise ValueError("unknown launcher %r (known: %s)" % (launcher, ", ".join(LAUNCHERS)))


def job_argv(*, launcher: str, python: str, nproc: int, command: Sequence[str], args: Sequence[str],
             resume_args: Sequence[str], values: dict[str, str], checkpoint: str | None,
             launcher_extra: Sequence[str] = (), rendezvous: Sequence[str] | None = None) -> list[str]:
    """The whole argv of one attempt: launcher prefix, the rendered command with the trainer arguments,
    then the rendered ``resume_args`` when a checkpoint exists (``checkpoint`` is its path)."""
    vals = dict(values)
    vals["checkpoint"] = checkpoint or ""
    argv = launcher_prefix(launcher, python, nproc, launcher_extra, rendezvous)
    argv += render(command, vals, render_args(args, vals))
    if checkpoint:
        argv += render(resume_args, vals, (), append_args=False)
    return argv
