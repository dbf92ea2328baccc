"""gpuq report's HTML page rendered by a real browser (headless Chromium, Debian's `chromium`):
the page loads with its figures decoded, and the screenshot shows a table and non-blank figures."""

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
            final = VALUES.get(name, (0.5, 0.5))[0]
            curves[job] = {
                "val_acc": [(s, final * (1 - math.exp(-s / 60)) + 0.01 * k) for s in range(0, 301, 20)],
                "loss": [(s, 3.0 * math.exp(-s / 40) + 0.001 + 0.002 * k) for s in range(1, 301, 5)],
            }
    return curves


def test_the_report_page_renders_in_a_real_browser(gpuq_home: Path, tmp_path: Path) -> None:
    ctx = api.open_context()
    _sweep(ctx, tmp_path, "qhtml00", QUEUE, VALUES, failed=("baseline-seed3",))
    report = build_report(ctx, [], collect=False)
    out = tmp_path / "report"
    page = write_report(report, _curves(report), out)
    assert sorted(p.name for p in out.iterdir()) == ["curve-loss.png", "curve-val_acc.png", "report.html"]
    text = page.read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text  # self-contained

    dom = _browser(f"--window-size={WIDTH},1000", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body and 'data-figures-loaded="2"' in body.group(0), dom.stdout[:500]
    height = int(re.search(r'data-height="(\d+)"', body.group(0)).group(1))  # type: ignore[union-attr]
    imgs = re.findall(r"<img [^>]*>", dom.stdout)
    assert len(imgs) == 2 and all('data-loaded="yes"' in tag for tag in imgs)
    table = re.search(r'<table id="cells"[^>]*>', dom.stdout)
    assert table is not None
    assert "lr_high" in dom.stdout and "within noise" in dom.stdout and "baseline-seed3" in dom.stdout

    shot = tmp_path / "page.png"
    run = _browser(f"--window-size={WIDTH},{height}", f"--screenshot={shot}", page.as_uri())
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
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
