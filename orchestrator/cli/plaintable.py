"""Big tables for people: the cells of a rich table as plain aligned text, for ``gpuq results`` and
``gpuq report`` past a screenful of rows.

rich measures, wraps and boxes every cell, about a millisecond a row: 11 s for the results of
10,000 jobs.  Past ``RICH_ROWS`` rows the same cells are written as ``gpuq submit --dry-run`` writes
its jobs (``orchestrator/cli/dryrun.py``): a title line, a header, one line per row, columns two
spaces apart and aligned by their width on screen (``rich.cells.cell_len``: wide characters count
two), right-aligned where the rich table right-aligns; nothing is wrapped.  On a terminal each cell
keeps its colour (a style's escape codes are rendered by rich once); in a pipe the text is plain,
as rich writes it.  A cell is printable text (``views/text.printable``) and a style; its text is
never read as markup.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import repeat

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

RICH_ROWS = 200  # rows up to which the rich table is drawn (about 0.2 s of drawing)

Cell = tuple[str, str]  # (text, rich style; "" for none)
Line = Sequence[Cell]  # a line of text in parts, each with its style


def big(rows: int) -> bool:
    """Whether a table of ``rows`` rows is written plain (past ``RICH_ROWS``)."""
    return rows > RICH_ROWS


class Painter:
    """Text in a style as ``console`` would write it: with the style's escape codes on a terminal
    that shows colour, as it is elsewhere (a pipe, a file, ``NO_COLOR``)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.plain = not console.is_terminal or console.no_color or console.color_system is None
        self._codes: dict[str, tuple[str, str]] = {}

    def __call__(self, text: str, style: str) -> str:
        if self.plain or not style or not text:
            return text
        codes = self._codes.get(style)
        if codes is None:
            with self.console.capture() as captured:
                self.console.print(Text("\x00", style=style), end="")
            before, _, after = captured.get().partition("\x00")
            codes = self._codes[style] = (before, after)
        return codes[0] + text + codes[1]


def write(console: Console, title: str, columns: Sequence[str], rows: Sequence[Sequence[Cell]], *,
          right: Collection[str] = ()) -> None:
    """``title``, then the header and ``rows`` (one cell per column each), aligned; column by column.  Each
    column's width is measured over every row first; then the lines are made and written ``BATCH`` rows at
    a time, so what is held beside the cells is one batch of lines, not a padded copy of the whole table."""
    paint = Painter(console)
    last = len(columns) - 1
    every = [[(name, "bold") for name in columns], *rows]
    measured = []
    for column in zip(*every, strict=True):
        ascii_only = all(text.isascii() for text, _ in column)
        measured.append((ascii_only, max((len if ascii_only else cell_len)(text) for text, _ in column),
                         paint.plain or not any(style for _, style in column)))
    lines = [paint(title, "italic")] if title else []
    for start in range(0, len(every), BATCH):
        shown: list[list[str]] = []
        batch = every[start:start + BATCH]
        for i, column in enumerate(zip(*batch, strict=True)):
            ascii_only, width, unpainted = measured[i]
            flush = columns[i] in right
            texts = [text for text, _ in column]
            if unpainted:
                if i == last and not flush:
                    shown.append(texts)
                elif ascii_only:
                    shown.append(list(map(str.rjust if flush else str.ljust, texts, repeat(width))))
                else:
                    shown.append(_padded(texts, list(map(cell_len, texts)), width, flush))
            else:
                painted = [paint(text, style) for text, style in column]
                sizes = list(map(len if ascii_only else cell_len, texts))
                shown.append(painted if i == last and not flush else _padded(painted, sizes, width, flush))
        lines += map("  ".join, zip(*shown, strict=True))
        console.file.write("\n".join(lines) + "\n")
        lines = []


BATCH = 2000  # rows of a plain table made into lines and written at a time


def _padded(texts: list[str], sizes: list[int], width: int, flush_right: bool) -> list[str]:
    """``texts`` padded with spaces to ``width`` columns on screen (``sizes``: their widths there)."""
    if flush_right:
        return [" " * (width - size) + text for text, size in zip(texts, sizes, strict=True)]
    return [text + " " * (width - size) for text, size in zip(texts, sizes, strict=True)]


def write_lines(console: Console, lines: Sequence[Line]) -> None:
    """Lines of text in parts, each part in its style (what a table prints below it)."""
    if lines:
        paint = Painter(console)
        console.file.write("".join("".join(paint(text, style) for text, style in line) + "\n" for line in lines))


def rich_line(line: Line) -> Text:
    """The same line for ``console.print``: its parts as text, never markup."""
    return Text.assemble(*line)


def rich_cell(cell: Cell) -> Text:
    """A cell for a rich table, styled as markup would style it (its text, not the padding)."""
    return Text.assemble(cell)
