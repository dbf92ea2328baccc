"""gpuq report's HTML page rendered by a real browser (headless Chromium, Debian's `chromium`) at 1400 px:
the page loads with its figures decoded; one outlier cell does not squash the metric's axis (the axis the
figure was drawn with, as the page records it, fits the other cells and the outlier is off scale); the table
is one line a row and fits the window; the headline, per-seed values, wall times and what differs from the
baseline are on the page; and the screenshot shows a table and non-blank figures."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator import api
from orchestrator.api.report import build_report
from orchestrator.report.html import write_report
from tests.unit.test_report_build import QUEUE, VALUES, _sweep

WIDTH = 1400
TALL = 6000  # the window's height: the whole page fits, so one screenshot shows every part of it
# a cell of two close seeds near 1: its Student-t interval goes past 1 (the page marks it); it runs with an
# argument the baseline does not (what differs)
NEAR_ONE = "configs/e.yaml classify 3 name=near_one seeds=2 -- --lr 0.5\n"
HTML_VALUES = {**VALUES, "near_one-seed0": (0.97, 0.97), "near_one-seed1": (0.99, 0.99)}


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if found is None:
        pytest.fail("headless Chromium is needed for the HTML report test: apt-get install chromium "
                    "(.ci/run installs it)")
    return found


def _browser(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--no-first-run", "--disable-extensions", "--virtual-time-budget=5000", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def _box(tag: str) -> tuple[int, int, int, int]:
    found = re.search(r'data-box="(\d+),(\d+),(\d+),(\d+)"', tag)
    assert found, tag
    left, top, width, height = (int(x) for x in found.groups())
    return left, top, width, height


def _curves(report) -> dict[str, dict[str, list[tuple[int, float]]]]:  # type: ignore[no-untyped-def]
    """Seeded, deterministic learning curves per job, shaped like the final values."""
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for cell in report.cells:
        for k, (job, name) in enumerate(zip(cell.jobs, cell.names, strict=True)):
            final = HTML_VALUES.get(name, (0.5, 0.5))[0]  # a failed seed sent a curve too
            curves[job] = {
                "val_acc": [(s, final * (1 - math.exp(-s / 60)) + 0.01 * k) for s in range(0, 301, 20)],
                "loss": [(s, 3.0 * math.exp(-s / 40) + 0.001 + 0.002 * k) for s in range(1, 301, 5)],
            }
    return curves


def _late(curves: dict[str, dict[str, list[tuple[int, float]]]], jobs: list[str]) -> list[float]:
    """The val_acc values of the second half of these jobs' curves."""
    return [v for job in jobs for s, v in curves.get(job, {}).get("val_acc", []) if s >= 160]


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def _check_page_content(report, dom: str) -> None:  # type: ignore[no-untyped-def]
    """The headline, the per-seed values and wall times, what differs, the [0, 1] mark, no repeated words."""
    text = _text(dom)
    assert report.headline.startswith("best: near_one, +0.16 vs baseline, "), report.headline
    assert f'id="headline">{report.headline}<' in dom.replace("&amp;", "&")
    titles = _text(" | ".join(re.findall(r"<(?:title|h1|h2|p)[^>]*>.*?</(?:title|h1|h2|p)>", dom, re.S)))
    assert "against baseline" in titles and "baseline baseline" not in titles  # never the word twice
    assert "baseline (baseline)" not in text
    assert not re.search(r"\d \+\d+\.\d+ CPU-h", text)  # never "0.00 +0.01 CPU-h"
    seeds = re.search(r'<table id="seeds".*?</table>', dom, re.S)
    assert seeds is not None
    row = re.search(r"<tr><td>baseline</td><td>baseline-seed1</td>.*?</tr>", seeds.group(0))
    assert row is not None and ">0.82<" in row.group(0) and ">0.83<" in row.group(0) and ">2m01s<" in row.group(0)
    assert "baseline-seed3" in seeds.group(0) and "FAILED" in seeds.group(0)
    differs = re.search(r'<li class="differs"><b>near_one</b>.*?</ul>', dom, re.S)
    assert differs is not None
    assert "config x: e (baseline a)" in differs.group(0) and "argument --lr: 0.5 (baseline unset)" in differs.group(0)
    near = re.search(r"<tr[^>]*><td[^>]*>near_one</td>.*?</tr>", dom)
    assert near is not None and "†" in near.group(0) and "goes past [0, 1]" in text
    assert "diverged" in near.group(0) or "diverged" in dom  # lr_high's flags are named in full below the table


def _check_axes(report, curves, dom: str) -> None:  # type: ignore[no-untyped-def]
    """val_acc's axis fits the cells other than lr_high (off scale, its line marked); the loss axis is log."""
    axes = {m.group(1): m.group(0) for m in re.finditer(r'<img [^>]*data-curve="([^"]+)"[^>]*>', dom)}
    assert set(axes) == {"val_acc", "loss"}
    acc = axes["val_acc"]
    low, high = (float(x) for x in re.search(r'data-ylim="([^"]+)"', acc).group(1).split(","))  # type: ignore[union-attr]
    assert 'data-off-scale="lr_high"' in acc
    others = [j for c in report.cells if c.cell != "lr_high" for j in c.jobs]
    outlier = [j for c in report.cells if c.cell == "lr_high" for j in c.jobs]
    assert max(_late(curves, outlier)) < low <= min(_late(curves, others))  # lr_high runs off the axis
    assert max(_late(curves, others)) <= high < 1.1  # the other cells fill it
    ticks = [float(t.replace("\u2212", "-")) for t in re.search(r'data-yticks="([^"]+)"', acc).group(1).split("|")]  # type: ignore[union-attr]
    assert len(ticks) >= 3 and all(low <= t <= high for t in ticks)
    assert 'data-yscale="log"' in axes["loss"] and 'data-off-scale=""' in axes["loss"]


def test_the_report_page_renders_in_a_real_browser(gpuq_home: Path, tmp_path: Path) -> None:
    ctx = api.open_context()
    _sweep(ctx, tmp_path, "qhtml00", QUEUE + NEAR_ONE, HTML_VALUES, failed=("baseline-seed3",))
    for k, job in enumerate(ctx.ledger.jobs(sweep_id="qhtml00")):
        ctx.ledger.update_attempt(job.id, 1, started_at=1000.0, ended_at=1000.0 + 120 + k)
    report = build_report(ctx, [], collect=False)
    out = tmp_path / "report"
    curves = _curves(report)
    page = write_report(report, curves, out)
    assert sorted(p.name for p in out.iterdir()) == ["curve-loss.png", "curve-val_acc.png", "report.html"]
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text  # self-contained

    shot = tmp_path / "page.png"  # one browser run: the DOM as laid out, and the screenshot of the whole page
    dom = _browser(f"--window-size={WIDTH},{TALL}", "--dump-dom", f"--screenshot={shot}", page.as_uri())
    assert dom.returncode == 0 and shot.is_file(), dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body and 'data-figures-loaded="2"' in body.group(0), dom.stdout[:500]
    assert int(re.search(r'data-height="(\d+)"', body.group(0)).group(1)) <= TALL  # type: ignore[union-attr]
    imgs = re.findall(r"<img [^>]*>", dom.stdout)
    assert len(imgs) == 2 and all('data-loaded="yes"' in tag for tag in imgs)
    table = re.search(r'<table id="cells"[^>]*>', dom.stdout)
    assert table is not None
    assert "lr_high" in dom.stdout and "within noise" in dom.stdout and "baseline-seed3" in dom.stdout
    _check_axes(report, curves, dom.stdout)
    _check_page_content(report, dom.stdout)
    left, _, width, _ = _box(table.group(0))
    assert left + width <= WIDTH and int(re.search(r'data-width="(\d+)"', body.group(0)).group(1)) <= WIDTH  # type: ignore[union-attr]
    heights = [int(h) for h in re.search(r'data-row-heights="([^"]+)"', table.group(0)).group(1).split(",")]  # type: ignore[union-attr]
    assert len(heights) == len(report.cells) + 1 and max(heights) <= 1.3 * min(heights), heights  # no row wraps

    import matplotlib.image

    pixels = matplotlib.image.imread(shot)  # rows x columns x RGB(A), floats in 0..1
    assert pixels.shape[1] == WIDTH

    def region(box: tuple[int, int, int, int]):  # type: ignore[no-untyped-def]
        left, top, width, height = box
        assert width > 100 and height > 50 and top + height <= pixels.shape[0], (box, pixels.shape)
        return pixels[top:top + height, left:left + width, :3]

    for tag in imgs:
        area = region(_box(tag))
        gray = area.mean(axis=2)
        assert gray.std() > 0.05, f"figure region is blank: {tag[:80]}"  # lines, text, bands
        assert (gray < 0.5).mean() > 0.005  # dark pixels: axes, labels, lines
        colored = (area.max(axis=2) - area.min(axis=2) > 0.25).mean()
        assert colored > 0.002  # the cells' coloured lines, not only black
    table_area = region(_box(table.group(0))).mean(axis=2)
    assert (table_area < 0.5).mean() > 0.01  # text drawn in the table
