"""Hardware a job asks for (``gpu=``, ``gpu_mem=`` on its queue line) against the GPUs a host has
(docs/queue.md, "GPU model and memory").  Pure: nothing here reads the clock or does I/O.

**Models.**  A model name as nvidia-smi reports it ("NVIDIA A100-SXM4-80GB") is split into words at
every character that is not a letter or digit (``nvidia``, ``a100``, ``sxm4``, ``80gb``).  A wanted
model matches when its letters and digits, case ignored and separators dropped, spell one word of the
name or several consecutive ones: ``A100`` and ``a100-sxm4`` match it, ``RTX4090`` matches "NVIDIA
GeForce RTX 4090"; ``A10`` does not match an A100, nor ``L40`` an L40S.  A job's models are
alternatives (``gpu=A100|H100``); a host matches when every one of its GPUs matches one of them.

**Memory.**  ``gpu_mem=`` is GB per GPU as cards are sold and providers list them (10^9 bytes), a
minimum: a host matches when its smallest GPU's ``memory.total`` is at least that many bytes.  A card
reports a little more than its size in GB and a little less than that number of GiB (an "80 GB" H100
reports 81,559 MiB = 85.5 GB = 79.6 GiB; a "24 GB" A10 23,028 MiB = 24.1 GB), so ``gpu_mem=80`` takes
any 80 GB card and ``gpu_mem=24`` an A10, the same words ``gpuq offers`` and ``gpuq up --for`` use.

**Unknown.**  A host whose GPUs gpuq has not learnt (registered by an older gpuq and not probed since,
a Slurm host whose GPUs are its compute nodes') matches no constrained job; the reason says so.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIB_PER_GB = 1e9 / 2**20  # MiB in one GB (10^9 bytes): 953.67
MAX_LISTED_HOSTS = 8  # hosts a reason names before "and N more"
_WORD_RE = re.compile(r"[A-Za-z0-9]+")


@dataclass(frozen=True)
class GpuNeed:
    """What a job asks of each GPU: one of ``models`` (none: any) with at least ``mem_gb`` GB (None: any)."""

    models: tuple[str, ...] = ()
    mem_gb: float | None = None

    def __bool__(self) -> bool:
        return bool(self.models) or self.mem_gb is not None

    @property
    def mem_mib(self) -> float | None:
        return None if self.mem_gb is None else self.mem_gb * MIB_PER_GB

    def text(self) -> str:
        """The queue line's words for it: ``gpu=A100|H100 gpu_mem=40``."""
        parts = [f"gpu={'|'.join(self.models)}"] if self.models else []
        if self.mem_gb is not None:
            parts.append(f"gpu_mem={_number(self.mem_gb)}")
        return " ".join(parts)


ANY_GPU = GpuNeed()
"""A job that asks nothing of its GPUs."""


@dataclass(frozen=True)
class HostGpus:
    """One host as a constrained job sees it: ``models`` (distinct, sorted; () = no GPUs, None = unknown)
    and ``mem_mib``, its smallest GPU's memory.total (None = unknown)."""

    name: str
    models: tuple[str, ...] | None
    mem_mib: float | None = None
    usable: bool = True
    reason: str = ""  # why it is unusable


def strictest(needs: Iterable[GpuNeed]) -> GpuNeed:
    """One ask for a host's preflight from the asks of the jobs planned there: the most memory any asks,
    and their models when they all ask for the same ones (else none: the scheduler checked each job)."""
    asks = [n for n in needs if n]
    mems = [n.mem_gb for n in asks if n.mem_gb is not None]
    models = {n.models for n in asks if n.models}
    return GpuNeed(next(iter(models)) if len(models) == 1 else (), max(mems) if mems else None)


def need_of(gpu: str | Sequence[str], gpu_mem: float | None) -> GpuNeed:
    """A job's need from its ledger row (``gpu`` as stored: "A100|H100") or its spec (a tuple)."""
    models = tuple(m for m in (gpu.split("|") if isinstance(gpu, str) else gpu) if m)
    return GpuNeed(models, gpu_mem)


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD_RE.findall(text)]


def model_matches(wanted: str, name: str) -> bool:
    """Whether the model ``wanted`` (a queue line's ``gpu=`` entry) names the GPU model ``name``."""
    target = "".join(_words(wanted))
    if not target:
        return False
    words = _words(name)
    for start in range(len(words)):
        spelled = ""
        for word in words[start:]:
            spelled += word
            if spelled == target:
                return True
            if not target.startswith(spelled):
                break
    return False


def host_matches(need: GpuNeed, models: tuple[str, ...] | None, mem_mib: float | None) -> bool:
    """Whether a host with these GPUs (``HostGpus``' fields) may take a job that needs ``need``."""
    if not need:
        return True
    if not models:  # unknown, or no GPUs
        return False
    if need.models and not all(any(model_matches(w, m) for w in need.models) for m in models):
        return False
    wanted = need.mem_mib
    return wanted is None or (mem_mib is not None and mem_mib >= wanted)


def describe(models: tuple[str, ...] | None, mem_mib: float | None) -> str:
    """A host's GPUs in a few words: "NVIDIA A10 24.1 GB", "no GPUs", "GPUs not known yet"."""
    if models is None:
        return "GPUs not known yet"
    if not models:
        return "no GPUs"
    memory = "memory unknown" if mem_mib is None else f"{_number(mem_mib / MIB_PER_GB)} GB"
    if len(models) == 1:
        return f"{models[0]} {memory}"
    return f"{' + '.join(models)}, smallest {memory}"


def unmet(need: GpuNeed, hosts: Sequence[HostGpus]) -> str:
    """Why no host may take a job that needs ``need``: no host matches it, or those that do are not
    usable; each host named with its GPUs (at most ``MAX_LISTED_HOSTS``)."""
    wants = f"needs {need.text()}"
    matching = [h for h in hosts if host_matches(need, h.models, h.mem_mib)]
    if matching:
        down = [f"{h.name} {h.reason or 'marked unusable'}" for h in matching if not h.usable]
        return f"{wants}: the hosts that match are not usable ({_listed(down)})"
    if not hosts:
        return f"{wants}: no hosts to run on"
    what = "has one" if need.models and need.mem_gb is None else \
        "has that much GPU memory" if not need.models else "has one with that much memory"
    unknown = sum(1 for h in hosts if h.models is None)
    note = f"; {unknown} of them not probed yet (`gpuq status` probes them)" if unknown else ""
    return f"{wants}: no host {what} (hosts: {_listed(f'{h.name}: {describe(h.models, h.mem_mib)}' for h in hosts)})" \
        + note


def _listed(items: Iterable[str]) -> str:
    shown = list(items)
    more = len(shown) - MAX_LISTED_HOSTS
    return ", ".join(shown[:MAX_LISTED_HOSTS]) + (f" and {more} more" if more > 0 else "")


def _number(value: float) -> str:
    """79.6, 80, 22.5: one decimal at most, none when whole."""
    rounded = round(value, 1)
    return str(int(rounded)) if rounded == int(rounded) else f"{rounded:.1f}"


# --- the ledger's record of a host's GPUs (HostRow.gpu_facts) ---------------------------------


def facts_json(gpus: Iterable[tuple[str, float | None]]) -> str:
    """The ledger's JSON of a host's GPUs, one ``[name, memory.total MiB or null]`` per GPU ("[]": none)."""
    rows = []
    for name, mem in gpus:
        fine = mem is not None and math.isfinite(mem) and mem >= 0
        printable = "".join(c for c in str(name) if c.isprintable())[:120]  # host text: shown in reasons
        rows.append([printable, float(mem) if fine and mem is not None else None])
    return json.dumps(rows)


def read_facts(text: str) -> tuple[tuple[str, ...] | None, float | None]:
    """(distinct models, smallest memory.total MiB) from ``facts_json``'s text; (None, None) when unknown
    ("", or not what ``facts_json`` writes)."""
    if not text:
        return None, None
    try:
        rows = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(rows, list):
        return None, None
    names: set[str] = set()
    mems: list[float] = []
    known = True
    for row in rows:
        if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str)):
            return None, None
        names.add(row[0])
        if isinstance(row[1], (int, float)) and not isinstance(row[1], bool):
            mems.append(float(row[1]))
        else:
            known = False
    return tuple(sorted(names)), (min(mems) if mems and known else None)
