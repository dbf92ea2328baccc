"""What ``gpuq submit --smoke`` says while it runs (issue 39 item 10: it was silent for 80-90 s, a
setup hook that pip-installs included): a line when a cell's attempt starts, stops and ends, and a
line when the project's setup hook starts and ends, as the wrapper's files in the smoke root show it
(``setup/<key>/setup.log`` appears when the hook starts, ``ok.json`` or ``failed.json`` when it ends:
``gpuq_setup.py``).  Pure reads of the smoke root; the words go to ``say`` (the CLI: stderr)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core import protocol

Say = Callable[[str], None]


def silent(_line: str) -> None:
    """The default: an API caller that asked for no progress."""


@dataclass
class SmokeTalk:
    """The progress lines of one smoke run; ``poll`` is called while an attempt runs."""

    root: Path
    say: Say = silent
    cell: str = ""  # the cell the next lines are about
    _setup: dict[str, float] = field(default_factory=dict)  # setup key -> when its hook was seen starting
    _ended: set[str] = field(default_factory=set)

    def about(self, cell: str, index: int, count: int) -> None:
        self.cell = f"{cell} ({index + 1}/{count})"

    def line(self, what: str) -> None:
        self.say(f"smoke {self.cell}: {what}")

    def poll(self) -> None:
        """A line for each setup hook that started or ended since the last poll."""
        top = self.root / protocol.SETUP_DIR
        if not top.is_dir():
            return
        for kdir in sorted(p for p in top.iterdir() if p.is_dir()):
            key = kdir.name
            if key not in self._setup and (kdir / "setup.log").exists():
                self._setup[key] = time.monotonic()
                self.line(f"setup hook started ([run] setup; its output: {kdir / 'setup.log'})")
            if key in self._setup and key not in self._ended:
                for name, verdict in (("ok.json", "done"), ("failed.json", "FAILED")):
                    if (kdir / name).exists():
                        self._ended.add(key)
                        self.line(f"setup hook {verdict} after {time.monotonic() - self._setup[key]:.0f} s")
