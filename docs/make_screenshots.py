"""Screenshots of a run's HTML report: its first screen and each of its sections, as small PNGs.

    python docs/make_screenshots.py                      # runs/demo (made by `circuitstat demo` if missing)
    python docs/make_screenshots.py --claims examples/claims-zoo.yaml   # the verdict lists the claims, too
    python docs/make_screenshots.py --run runs/audit --out /tmp/shots

Renders the run's report (circuitstat.reports.html.render_report), opens it in headless Chromium (Debian's
``chromium``; ``make browser`` installs it) at 1400 x 1000 for the first screen, then once per section
with the rest of the page hidden, and writes ``first-screen.png`` and ``section-<id>.png``, reduced to
256 colours (Pillow, in the dev extras) so the set stays small enough to commit (docs/screenshots/).
With ``--claims FILE`` the claims are checked against the run first and their results written into it
(claims.parquet), so the verdict shows one line per claim.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTH, FIRST_HEIGHT = 1400, 1000
MAX_SECTION_HEIGHT = 2200  # a section taller than this is cut (its tables scroll inside the page anyway)
MEASURE = """<script>(function () {
  var out = {};
  document.querySelectorAll('main > section').forEach(function (s) { out[s.id] = s.getBoundingClientRect().height; });
  document.documentElement.setAttribute('data-heights', JSON.stringify(out));
})();</script></body>"""
ONLY = ("<style>header,nav,footer,main>p.note{{display:none}} main>section:not(#{id}){{display:none}} "
        "main{{padding-top:6px}}</style></head>")


def chromium() -> str:
    """Return the headless browser's path, or exit naming how to install it."""
    for c in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if c and os.path.exists(c):
            return c
    sys.exit("headless Chromium is needed: run `make browser` (or apt-get install -y chromium)")


def browser(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    """Run headless Chromium with `args` and a throwaway profile."""
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)


def demo_run(path: Path) -> Path:
    """Return the demo's run directory, running `circuitstat demo` (it reuses the cached zoo) when it is missing."""
    if not (path / "edge_stats.parquet").exists():
        subprocess.run([sys.executable, "-m", "circuitstat.pipelines.cli", "demo", "--out", str(path)], check=True, cwd=ROOT)
    return path


def shrink(png: Path) -> int:
    """Reduce `png` to a 256-colour palette (the report is flat colours: nothing visible is lost); return its size."""
    from PIL import Image

    with Image.open(png) as im:
        small = im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(png, optimize=True)
    return png.stat().st_size


def screenshots(run: Path, out: Path) -> list[tuple[Path, int]]:
    """Write the first screen and one PNG per section of `run`'s report into `out`; return (path, bytes)."""
    from circuitstat.reports.html import render_report

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        page = render_report(run, tmp_path / "report.html").read_text(encoding="utf-8")
        probe = tmp_path / "measure.html"
        probe.write_text(page.replace("</body>", MEASURE), encoding="utf-8")
        dom = browser([f"--window-size={WIDTH},{FIRST_HEIGHT}", "--dump-dom", probe.as_uri()], tmp_path / "p").stdout
        heights = json.loads(re.search(r'data-heights="([^"]*)"', dom).group(1).replace("&quot;", '"'))
        shots = [(out / "first-screen.png", tmp_path / "report.html", FIRST_HEIGHT)]
        for sid, h in heights.items():
            one = tmp_path / f"{sid}.html"
            one.write_text(page.replace("</head>", ONLY.format(id=sid), 1), encoding="utf-8")
            shots.append((out / f"section-{sid}.png", one, min(int(h) + 16, MAX_SECTION_HEIGHT)))
        written = []
        for png, html, height in shots:
            browser([f"--window-size={WIDTH},{height}", f"--screenshot={png}", html.as_uri()], tmp_path / "p")
            written.append((png, shrink(png)))
    return written


def main(argv: list[str] | None = None) -> None:
    """Parse the arguments, take or make the run, write the screenshots and print their sizes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=None, help="run directory (default: runs/demo, made if missing)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots", help="where the PNGs go")
    ap.add_argument("--claims", type=Path, default=None, help="a claims file to check first (its results go into the run)")
    a = ap.parse_args(argv)
    run = a.run if a.run is not None else demo_run(ROOT / "runs" / "demo")
    if a.claims is not None:
        from circuitstat.pipelines.claims import evaluate_claims, load_claims, write_claims_table

        results = evaluate_claims(load_claims(a.claims), run)
        write_claims_table(results, run)
        print(f"claims: {sum(r.status == 'pass' for r in results)} of {len(results)} hold ({run / 'claims.parquet'})")
    for stale in a.out.glob("section-*.png") if a.out.is_dir() else []:
        stale.unlink()  # a section the run no longer has leaves no picture behind
    written = screenshots(run, a.out)
    for png, size in written:
        print(f"{png.relative_to(ROOT) if png.is_relative_to(ROOT) else png}  {size / 1024:.0f} KiB")
    print(f"total {sum(s for _, s in written) / 1024:.0f} KiB in {len(written)} files")


if __name__ == "__main__":
    main()
