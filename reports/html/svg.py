"""Inline SVG for the HTML report: scales with nice ticks, axes, lines, bands, points, colour scales.

Plain strings, no plotting library: a plot is a few kilobytes and renders identically everywhere.
Every piece of text that goes into the SVG passes through `esc`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

import numpy as np

from circuitstat.reports.ci import fmt

# Okabe-Ito: distinguishable under the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442")
VIRIDIS = ("#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725")
BLUES = ("#9ecae1", "#6baed6", "#3182bd", "#08519c", "#08306b")
FONT = 11


def esc(value: object) -> str:
    """Return `value` as text escaped for HTML/SVG content and attributes."""
    return html.escape(str(value), quote=True)


def finite(*arrays: np.ndarray) -> np.ndarray:
    """Return the mask of positions where every array is finite."""
    mask = np.ones(len(arrays[0]), dtype=bool)
    for a in arrays:
        mask &= np.isfinite(np.asarray(a, dtype=float))
    return mask


def fmt_p(x: object) -> str:
    """Return a p- or q-value with two significant digits (scientific below 0.001)."""
    return fmt(x, 2)


def tick_label(v: float) -> str:
    """Return a short axis tick label."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    s = f"{v:.6g}"
    return s


# ----- scales -----------------------------------------------------------------------------------
def nice_step(span: float, n: int) -> float:
    """Return a 1/2/2.5/5 x 10^k step giving about `n` intervals over `span`."""
    if not span > 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag * (1 + 1e-9):
            return m * mag
    return 10 * mag


def padded(lo: float, hi: float, frac: float = 0.05) -> tuple[float, float]:
    """Return (lo, hi) widened by `frac` of the span (or by a unit-ish amount when lo == hi)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return 0.0, 1.0
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        d = abs(lo) * 0.1 or 1.0
        return lo - d, hi + d
    d = (hi - lo) * frac
    return lo - d, hi + d


def data_range(*arrays: Iterable[float]) -> tuple[float, float]:
    """Return (min, max) over the finite values of all arrays, (nan, nan) if none."""
    vals = [np.asarray(list(a) if not isinstance(a, np.ndarray) else a, dtype=float).ravel() for a in arrays]
    allv = np.concatenate(vals) if vals else np.array([])
    allv = allv[np.isfinite(allv)]
    if allv.size == 0:
        return math.nan, math.nan
    return float(allv.min()), float(allv.max())


class Scale:
    """Map data values in [lo, hi] to pixels in [a, b] (linear, or log10 when `log`)."""

    def __init__(self, lo: float, hi: float, a: float, b: float, log: bool = False) -> None:
        if log:
            lo, hi = max(lo, 1e-300), max(hi, 1e-300)
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo, hi = (1.0, 10.0) if log else (0.0, 1.0)
        if hi == lo:
            lo, hi = (lo / 2, hi * 2) if log else padded(lo, hi)
        self.lo, self.hi, self.a, self.b, self.log = lo, hi, a, b, log
        self._l0 = math.log10(lo) if log else lo
        self._l1 = math.log10(hi) if log else hi

    def __call__(self, v: float) -> float:
        t = (math.log10(v) if v > 0 else -math.inf) if self.log else v
        return self.a + (t - self._l0) / (self._l1 - self._l0) * (self.b - self.a)

    def many(self, values: np.ndarray) -> np.ndarray:
        """Return the pixel positions of `values` (NaN where a log scale has no position)."""
        v = np.asarray(values, dtype=float)
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                v = np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.nan)
        return self.a + (v - self._l0) / (self._l1 - self._l0) * (self.b - self.a)

    def ticks(self, n: int = 5) -> list[float]:
        """Return tick values inside the domain."""
        lo, hi = self.lo, self.hi
        if self.log:
            d0, d1 = math.floor(math.log10(lo) + 1e-9), math.ceil(math.log10(hi) - 1e-9)
            best: list[float] = []
            for mults in ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7)):
                out = [m * 10.0**d for d in range(d0, d1 + 1) for m in mults]
                out = [float(f"{t:.6g}") for t in out if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
                best = out
                if len(out) >= 4:
                    break
            return best or [lo, hi]
        step = nice_step(hi - lo, n)
        start = math.ceil(lo / step - 1e-9) * step
        out = []
        t = start
        while t <= hi + step * 1e-9 and len(out) < 50:
            out.append(0.0 if abs(t) < step * 1e-9 else round(t, 12))
            t += step
        return out


def nice_domain(lo: float, hi: float, n: int = 5) -> tuple[float, float]:
    """Return (lo, hi) widened to multiples of a nice tick step."""
    lo, hi = (lo, hi) if hi > lo else padded(lo, hi)
    step = nice_step(hi - lo, n)
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step


def use_log(values: Sequence[float]) -> bool:
    """Return True when positive values span more than a factor of 20 (then a log axis reads better)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    return bool(v.size and v.min() > 0 and v.max() / v.min() > 20)


# ----- colours ----------------------------------------------------------------------------------
def _hex(c: str) -> tuple[int, int, int]:
    return int(c[1:3], 16), int(c[3:5], 16), int(c[5:7], 16)


def ramp(stops: Sequence[str], t: float) -> str:
    """Return the colour at t in [0, 1] interpolated along `stops` (NaN -> light grey)."""
    if not math.isfinite(t):
        return "#dddddd"
    t = min(max(t, 0.0), 1.0) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    a, b = _hex(stops[i]), _hex(stops[i + 1])
    return "#%02x%02x%02x" % tuple(round(x + (y - x) * f) for x, y in zip(a, b))


def text_colour(fill: str) -> str:
    """Return black or white, whichever reads better on `fill`."""
    r, g, b = _hex(fill)
    return "#000" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#fff"


def colour_legend(x: float, y: float, stops: Sequence[str], lo: float, hi: float, label: str, width: float = 160) -> str:
    """Return a horizontal colour bar with end/middle labels (drawn as rects: no ids to collide)."""
    n = 24
    w = width / n
    parts = [f'<g class="legend"><text x="{x:.1f}" y="{y - 4:.1f}" font-size="{FONT}">{esc(label)}</text>']
    for i in range(n):
        parts.append(f'<rect x="{x + i * w:.1f}" y="{y:.1f}" width="{w + 0.4:.1f}" height="10" fill="{ramp(stops, (i + 0.5) / n)}"/>')
    for t in (0.0, 0.5, 1.0):
        v = lo + (hi - lo) * t
        anchor = "start" if t == 0 else ("end" if t == 1 else "middle")
        # two significant digits: a colour bar's ends come from the data (0.287981 reads as 0.29)
        lab = tick_label(float(f"{v:.2g}"))
        parts.append(f'<text x="{x + width * t:.1f}" y="{y + 22:.1f}" font-size="{FONT - 1}" text-anchor="{anchor}">{esc(lab)}</text>')
    parts.append("</g>")
    return "".join(parts)


# ----- plots ------------------------------------------------------------------------------------
class Plot:
    """One SVG chart: a plotting area with x and y scales, axes, and marks added in order."""

    def __init__(
        self,
        width: float,
        height: float,
        xdomain: tuple[float, float],
        ydomain: tuple[float, float],
        *,
        margin: tuple[float, float, float, float] = (16, 16, 42, 56),
        xlog: bool = False,
        ylog: bool = False,
        label: str = "",
    ) -> None:
        self.width, self.height = width, height
        top, right, bottom, left = margin
        self.left, self.right, self.top, self.bottom = left, width - right, top, height - bottom
        self.x = Scale(xdomain[0], xdomain[1], self.left, self.right, xlog)
        self.y = Scale(ydomain[0], ydomain[1], self.bottom, self.top, ylog)
        self.label = label
        self.parts: list[str] = []
        self.legend_items: list[tuple[str, str, str]] = []

    # axes
    def axes(
        self,
        xlabel: str,
        ylabel: str,
        *,
        xticks: Sequence[float] | None = None,
        yticks: Sequence[float] | None = None,
        xtick_labels: Sequence[str] | None = None,
        ytick_labels: Sequence[str] | None = None,
        grid: bool = True,
    ) -> None:
        """Draw the frame, ticks with labels, grid lines and the axis labels."""
        xt = list(self.x.ticks() if xticks is None else xticks)
        yt = list(self.y.ticks() if yticks is None else yticks)
        xl = list(xtick_labels) if xtick_labels is not None else [tick_label(t) for t in xt]
        yl = list(ytick_labels) if ytick_labels is not None else [tick_label(t) for t in yt]
        p = ['<g class="axes">']
        for t, lab in zip(yt, yl):
            py = self.y(t)
            if grid:
                p.append(f'<line x1="{self.left:.1f}" x2="{self.right:.1f}" y1="{py:.1f}" y2="{py:.1f}" stroke="#e6e6e6"/>')
            p.append(f'<line x1="{self.left - 4:.1f}" x2="{self.left:.1f}" y1="{py:.1f}" y2="{py:.1f}" stroke="#333"/>')
            p.append(f'<text x="{self.left - 6:.1f}" y="{py + 3.5:.1f}" text-anchor="end" font-size="{FONT - 1}">{esc(lab)}</text>')
        for t, lab in zip(xt, xl):
            px = self.x(t)
            if grid:
                p.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{self.top:.1f}" y2="{self.bottom:.1f}" stroke="#f0f0f0"/>')
            p.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{self.bottom:.1f}" y2="{self.bottom + 4:.1f}" stroke="#333"/>')
            p.append(f'<text x="{px:.1f}" y="{self.bottom + 15:.1f}" text-anchor="middle" font-size="{FONT - 1}">{esc(lab)}</text>')
        p.append(
            f'<path d="M{self.left:.1f},{self.top:.1f}V{self.bottom:.1f}H{self.right:.1f}" fill="none" stroke="#333"/>'
            f'<text x="{(self.left + self.right) / 2:.1f}" y="{self.height - 6:.1f}" text-anchor="middle" font-size="{FONT}">{esc(xlabel)}</text>'
            f'<text transform="translate(13,{(self.top + self.bottom) / 2:.1f}) rotate(-90)" text-anchor="middle" font-size="{FONT}">{esc(ylabel)}</text>'
            "</g>"
        )
        # axes go under the marks
        self.parts.insert(0, "".join(p))

    # marks
    def _segments(self, xs: np.ndarray, ys: np.ndarray) -> list[list[tuple[float, float]]]:
        px, py = self.x.many(xs), self.y.many(ys)
        segs, cur = [], []
        for a, b in zip(px, py):
            if math.isfinite(a) and math.isfinite(b):
                cur.append((a, b))
            elif cur:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        return segs

    def line(self, xs, ys, colour: str, *, width: float = 1.8, dash: str | None = None, title: str | None = None, opacity: float = 1.0) -> None:
        """Draw a polyline, broken where a value is not finite."""
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        op = f' stroke-opacity="{opacity}"' if opacity != 1 else ""
        for seg in self._segments(np.asarray(xs, float), np.asarray(ys, float)):
            d = "M" + "L".join(f"{a:.1f},{b:.1f}" for a, b in seg)
            t = f"<title>{esc(title)}</title>" if title else ""
            self.parts.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width}"{dash_attr}{op}>{t}</path>')

    def band(self, xs, lo, hi, colour: str, *, opacity: float = 0.18) -> None:
        """Fill between `lo` and `hi` (broken where a value is not finite)."""
        xs, lo, hi = (np.asarray(v, float) for v in (xs, lo, hi))
        ok = finite(xs, lo, hi)
        if self.x.log:
            ok &= xs > 0
        idx = np.flatnonzero(ok)
        if idx.size == 0:
            return
        runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
        for r in runs:
            px, pl, ph = self.x.many(xs[r]), self.y.many(lo[r]), self.y.many(hi[r])
            pts = [f"{a:.1f},{b:.1f}" for a, b in zip(px, ph)] + [f"{a:.1f},{b:.1f}" for a, b in zip(px[::-1], pl[::-1])]
            self.parts.append(f'<polygon points="{" ".join(pts)}" fill="{colour}" fill-opacity="{opacity}" stroke="none"/>')

    def hline(self, y: float, colour: str = "#555", *, dash: str | None = "5,4", width: float = 1.2, label: str | None = None) -> None:
        """Draw a horizontal line at data y (nothing outside the domain), with an optional label."""
        if not (math.isfinite(y) and self.y.lo <= y <= self.y.hi):
            return
        py = self.y(y)
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{self.left:.1f}" x2="{self.right:.1f}" y1="{py:.1f}" y2="{py:.1f}" stroke="{colour}" stroke-width="{width}"{d}/>')
        if label:
            self.parts.append(f'<text x="{self.right - 3:.1f}" y="{py - 3:.1f}" text-anchor="end" font-size="{FONT - 1}" fill="{colour}">{esc(label)}</text>')

    def vline(self, x: float, colour: str = "#555", *, dash: str | None = "5,4", width: float = 1.0) -> None:
        """Draw a vertical line at data x (nothing outside the domain)."""
        if not (math.isfinite(x) and self.x.lo <= x <= self.x.hi):
            return
        px = self.x(x)
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{self.top:.1f}" y2="{self.bottom:.1f}" stroke="{colour}" stroke-width="{width}"{d}/>')

    def points(self, xs, ys, colour: str, *, r: float = 3.0, titles: Sequence[str] | None = None, opacity: float = 1.0,
               shape: str = "circle", attrs: Sequence[str] | None = None) -> None:
        """Draw markers; with `titles` each gets a tooltip (and `attrs`, raw attributes, on its element), without
        them all share one compact path."""
        xs, ys = np.asarray(xs, float), np.asarray(ys, float)
        px, py = self.x.many(xs), self.y.many(ys)
        ok = finite(px, py)
        op = f' fill-opacity="{opacity}"' if opacity != 1 else ""
        if titles is None:
            if shape == "x":
                d = "".join(f"M{a - r:.1f},{b - r:.1f}l{2 * r:.1f},{2 * r:.1f}m0,{-2 * r:.1f}l{-2 * r:.1f},{2 * r:.1f}" for a, b in zip(px[ok], py[ok]))
                self.parts.append(f'<path d="{d}" stroke="{colour}" stroke-width="1.5" fill="none"/>')
            else:
                d = "".join(f"M{a:.1f},{b:.1f}h0" for a, b in zip(px[ok], py[ok]))
                sop = f' stroke-opacity="{opacity}"' if opacity != 1 else ""
                self.parts.append(f'<path d="{d}" stroke="{colour}" stroke-width="{2 * r:.1f}" stroke-linecap="round" fill="none"{sop}/>')
            return
        extra = list(attrs) if attrs is not None else [""] * len(titles)
        for a, b, t, good, at in zip(px, py, titles, ok, extra):
            if not good:
                continue
            if shape == "x":
                self.parts.append(
                    f'<path{at} d="M{a - r:.1f},{b - r:.1f}l{2 * r:.1f},{2 * r:.1f}m0,{-2 * r:.1f}l{-2 * r:.1f},{2 * r:.1f}" stroke="{colour}" stroke-width="1.5" fill="none"><title>{esc(t)}</title></path>'
                )
            else:
                self.parts.append(f'<circle{at} cx="{a:.1f}" cy="{b:.1f}" r="{r}" fill="{colour}"{op}><title>{esc(t)}</title></circle>')

    def hbar(self, y: float, x0: float, x1: float, colour: str, *, width: float = 1.5) -> None:
        """Draw a horizontal interval (e.g. a CI in a forest plot) at data y."""
        if not (math.isfinite(x0) and math.isfinite(x1) and math.isfinite(y)):
            return
        a, b, py = self.x(x0), self.x(x1), self.y(y)
        a, b = (max(min(v, self.right), self.left) for v in (a, b))
        self.parts.append(f'<path d="M{a:.1f},{py:.1f}H{b:.1f}M{a:.1f},{py - 3:.1f}v6M{b:.1f},{py - 3:.1f}v6" stroke="{colour}" stroke-width="{width}" fill="none"/>')

    def vbar(self, x: float, y0: float, y1: float, colour: str, *, width: float = 1.5) -> None:
        """Draw a vertical interval (error bar) at data x."""
        if not (math.isfinite(x) and math.isfinite(y0) and math.isfinite(y1)):
            return
        px, a, b = self.x(x), self.y(y0), self.y(y1)
        a, b = (min(max(v, self.top), self.bottom) for v in (a, b))
        self.parts.append(f'<path d="M{px:.1f},{a:.1f}V{b:.1f}M{px - 3:.1f},{a:.1f}h6M{px - 3:.1f},{b:.1f}h6" stroke="{colour}" stroke-width="{width}" fill="none"/>')

    def raw(self, svg: str) -> None:
        """Add a piece of SVG drawn in pixel coordinates."""
        self.parts.append(svg)

    def legend(self, label: str, colour: str, style: str = "line") -> None:
        """Add an entry ('line', 'dash', 'dot', 'band', 'box', 'point', 'x') to the legend drawn below the plot."""
        self.legend_items.append((label, colour, style))

    def _legend_svg(self) -> tuple[str, float]:
        """Return (svg, extra height): the legend flows in rows below the x-axis label, never over data."""
        if not self.legend_items:
            return "", 0.0
        x, y = self.left, self.height + 8
        p = ['<g class="legend">']
        for lab, c, style in self.legend_items:
            w = 30 + 6.0 * len(lab) + 14
            if x + w > self.width and x > self.left:
                x, y = self.left, y + 16
            yy = y + 4
            if style in ("band", "box"):
                op = ' fill-opacity="0.25"' if style == "band" else ""
                p.append(f'<rect x="{x:.1f}" y="{yy - 5:.1f}" width="18" height="8" fill="{c}"{op}/>')
            elif style == "point":
                p.append(f'<circle cx="{x + 9:.1f}" cy="{yy - 1:.1f}" r="3.5" fill="{c}"/>')
            elif style == "x":
                p.append(f'<path d="M{x + 6:.1f},{yy - 4:.1f}l6,6m0,-6l-6,6" stroke="{c}" stroke-width="1.5"/>')
            else:
                dash = {"dash": ' stroke-dasharray="5,3"', "dot": ' stroke-dasharray="1.5,2.5"'}.get(style, "")
                p.append(f'<line x1="{x:.1f}" x2="{x + 18:.1f}" y1="{yy - 1:.1f}" y2="{yy - 1:.1f}" stroke="{c}" stroke-width="2"{dash}/>')
            p.append(f'<text x="{x + 24:.1f}" y="{yy + 3:.1f}" font-size="{FONT - 1}">{esc(lab)}</text>')
            x += w
        p.append("</g>")
        return "".join(p), y + 14 - self.height

    def svg(self) -> str:
        """Return the plot as one SVG element, legend included."""
        legend, extra = self._legend_svg()
        return svg_open(self.width, self.height + extra, self.label) + "".join(self.parts) + legend + "</svg>"


def svg_open(width: float, height: float, label: str) -> str:
    """Return the opening tag of a free-form SVG figure."""
    return (
        f'<svg class="plot" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" height="{height:.0f}" '
        f'role="img" aria-label="{esc(label)}" font-family="sans-serif">'
    )
