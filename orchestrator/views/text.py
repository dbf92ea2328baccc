"""Text a person reads: host text made safe for a terminal, and the short forms of times, money, shares.

Anything a host wrote (an error, a health detail, a GPU name, a log line, an alert built from them)
may carry terminal control sequences: ``\\x1b]0;`` sets the window title, ``\\x1b]52;`` writes the
clipboard, ``\\x1b[8m`` hides what follows.  ``printable`` drops every control and format character
(Unicode categories C*, and separators other than a space), so none reaches a terminal from a view;
``shown_escaped`` keeps a log's lines and tabs and writes every other control character as an
escape (``\\x1b``); ``readable_log`` is what ``gpuq logs`` prints: a Rich/tqdm/Lightning log made readable
(colours, cursor moves and erases dropped, each line's last segment after a carriage return kept, as a
terminal would have shown it), then ``shown_escaped`` (``--raw`` prints the bytes as they are).
"""

from __future__ import annotations

import re
import time

WHITESPACE = "\t\n\r\v\f\x1c\x1d\x1e\x1f\x85\u2028\u2029"


def printable(text: str) -> str:
    """``text`` without control characters: whitespace becomes a space, every other control is dropped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else " " if c in WHITESPACE else "" for c in text)


def shown_escaped(text: str) -> str:
    """``text`` for a terminal with its line breaks and tabs kept and every other control character
    written as a visible escape (``\\x1b``, ``\\r``, ``\\u202e``): a log shows what the host wrote,
    and nothing the host wrote acts on the terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else _escape(c) for c in text.replace("\r\n", "\n"))


# CSI sequences (ESC [ or the 8-bit CSI, parameters, intermediates, a final byte): SGR colours, cursor
# moves, erases, scroll regions; none carries text a reader needs
CSI = re.compile(r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]")


def readable_log(text: str) -> str:
    """A log as its terminal would have shown it: CSI sequences (colours, cursor moves, erases) dropped,
    of each line only what follows its last carriage return (a progress bar's final state), then
    ``shown_escaped`` for every other control character (an OSC title or clipboard write, a BEL, a
    bidi override): readable, and nothing in it acts on the terminal."""
    text = CSI.sub("", text.replace("\r\n", "\n"))
    if "\r" in text:
        text = "\n".join(_last_segment(line) for line in text.split("\n"))
    return shown_escaped(text)


def _last_segment(line: str) -> str:
    segments = line.split("\r")
    return next((s for s in reversed(segments) if s), "")  # "bar 100%\r" ends with an empty segment


def _escape(char: str) -> str:
    code = ord(char)
    if char == "\r":
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def one_line(text: str, limit: int = 0) -> str:
    """``text`` on one line (a remote error may span many), printable, cut to ``limit`` characters when given."""
    flat = " ".join(printable(text).split())
    return flat if not limit or len(flat) <= limit else flat[:limit - 1] + "…"


def clock(ts: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(ts))


def rough_duration(seconds: float) -> str:
    """A rough duration for people: seconds, minutes or hours (a projection, not a measurement)."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def duration(seconds: float | None) -> str:
    """Short duration for tables: 45s, 12m, 3h05m, 2d4h; "-" for None."""
    if seconds is None:
        return "-"
    s = int(max(0.0, seconds))
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:.2f}"


def pct(value: object) -> str:
    return f"{value:.0f}%" if isinstance(value, int | float) else "?"
