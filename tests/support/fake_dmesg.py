#!/usr/bin/env python3
"""A fake ``dmesg`` for test hosts: prints a per-host kernel-log fixture.  stdlib only.

``fake_dmesg.py --log PATH [dmesg options...]``.  PATH holds the kernel lines exactly as ``dmesg``
prints them (``[ 1234.567890] NVRM: Xid (PCI:0000:18:00): 79, ...``); a missing file is an empty
log.  When ``PATH.unreadable`` exists the log reads as it does under ``kernel.dmesg_restrict=1`` for
an unprivileged user: ``dmesg: read kernel buffer failed: Operation not permitted``, exit 1.

Options are accepted and ignored, except ``-t``/``--notime`` (timestamps left out).
"""

from __future__ import annotations

import os
import re
import sys

UNREADABLE = "dmesg: read kernel buffer failed: Operation not permitted"
TS_RE = re.compile(r"^\[\s*\d+(?:\.\d+)?\]\s?")


def unreadable_flag(log: str) -> str:
    return log + ".unreadable"


def main(argv: list[str]) -> int:
    args = list(argv)
    log = ""
    if len(args) >= 2 and args[0] == "--log":
        log, args = args[1], args[2:]
    if not log or os.path.exists(unreadable_flag(log)):
        print(UNREADABLE, file=sys.stderr)
        return 1
    notime = "-t" in args or "--notime" in args
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    except OSError as e:
        print(f"dmesg: {e}", file=sys.stderr)
        return 1
    out = sys.stdout
    for line in text.splitlines():
        out.write((TS_RE.sub("", line) if notime else line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
