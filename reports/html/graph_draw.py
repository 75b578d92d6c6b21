"""Drawing a circuit as SVG: nodes in layer rows (input at the bottom, logits on top), edges as curves.

Edges enter a head at its q, k or v input (left, middle, right of its box). The edges with the
largest |effect| carry their rank, estimate and interval as a label placed on the curve where it
overlaps no other label or node; each curve and label carries the data attributes of its interval
(circuitstat.reports.html.common.ci_attrs), so the page's intervals can be read back from their table.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import ci_attrs
from circuitstat.reports.html.svg import BLUES, FONT, colour_legend, esc, fmt, fmt_p, ramp, svg_open

__all__ = ["Drawn", "draw_circuit", "minority_sign", "node_key", "row_label"]

MAX_NODES = 700  # more nodes than this: only those the circuit touches (plus input, MLPs, logits)
PORT_OFFSET = {"q": -0.3, "k": 0.0, "v": 0.3}
# where along a curve (0: sender, 1: receiver) a label may sit, in order of preference: near the receiver's
# port first, where curves run apart and nearly vertical, then further back
LABEL_T = (0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2)
_HEAD = re.compile(r"^a(\d+)\.h(\d+)$")
_MLP = re.compile(r"^m(\d+)$")
_EXPERT = re.compile(r"^m(\d+)\.(?:e(\d+)|shared)$")  # experts as nodes (circuitstat.circuits.moe_nodes)
_PORT = re.compile(r"^(.*)<([^<>]*)>$")


@dataclass(frozen=True)
class Drawn:
    """One circuit edge to draw: its index, name, endpoints, interval, inclusion frequency and q-value."""

    edge: int
    name: str
    sender: str
    receiver: str  # with its <q>/<k>/<v> port
    ci: Ci
    frequency: float  # NaN: the run has no inclusion table
    q: float | None


def node_key(name: str, layer_hint: dict[str, int]) -> tuple[float, int, float, str]:
    """Return (layer, sub-row, position, name): input lowest, then per layer heads then MLP (with its experts when they
    are nodes), logits top."""
    if name == "input":
        return (-1, 0, 0, name)
    if name == "logits":
        return (math.inf, 0, 0, name)
    m = _HEAD.match(name)
    if m:
        return (int(m.group(1)), 1, int(m.group(2)), name)
    m = _MLP.match(name)
    if m:
        return (int(m.group(1)), 2, 0, name)
    m = _EXPERT.match(name)
    if m:  # beside the block's input m{L} on the layer's MLP row; the shared expert last
        return (int(m.group(1)), 2, 1 + (int(m.group(2)) if m.group(2) is not None else 10**6), name)
    return (layer_hint.get(name, 0), 3, 0, name)


def row_label(key: tuple[float, int]) -> str:
    """Return the label of a graph row: input, logits or 'L<layer> attn|mlp|other'."""
    layer, kind = key
    if layer == -1:
        return "input"
    if layer == math.inf:
        return "logits"
    return f"L{int(layer)} " + {1: "attn", 2: "mlp", 3: "other"}[kind]


@dataclass
class _Layout:
    """Where the drawing puts things: canvas, node box size, each node's centre, the row labels."""

    width: int
    height: float
    nw: float
    nh: float
    font: float
    pos: dict[str, tuple[float, float]]
    rows_svg: list[str]


def _layout(nodes: set[str], hint: dict[str, int], width: int, top: float) -> _Layout:
    """Return the layout of `nodes` in `width` pixels: one row per layer and kind, rows spaced to read."""
    rows: dict[tuple[float, int], list[str]] = {}
    for n in nodes:
        rows.setdefault(node_key(n, hint)[:2], []).append(n)
    keys = sorted(rows)
    for k in keys:
        rows[k].sort(key=lambda n: node_key(n, hint)[2:])
    large = width >= 800
    left, right = (70, 16) if large else (52, 8)
    widest = max((len(v) for v in rows.values()), default=1)
    sx = (width - left - right) / max(widest, 1)
    nw, nh = max(min(sx * 0.72, 96.0 if large else 60.0), 5.0), (28.0 if large else 16.0)
    rh = (max(44.0, min(190.0, 620 / max(len(keys) - 1, 1))) if large else max(24.0, min(80.0, 260 / max(len(keys) - 1, 1))))
    pad = nh / 2 + 10  # the top and bottom rows sit this far inside the drawing
    height = top + 2 * pad + (len(keys) - 1) * rh
    pos: dict[str, tuple[float, float]] = {}
    out = []
    for i, key in enumerate(keys):
        y = height - pad - i * rh
        ns = rows[key]
        x0 = left + (width - left - right - sx * len(ns)) / 2 + sx / 2
        for j, n in enumerate(ns):
            pos[n] = (x0 + j * sx, y)
        out.append(f'<text x="4" y="{y + 4:.1f}" font-size="{FONT if large else FONT - 2}" fill="#555">'
                   f"{esc(row_label(key))}</text>")
        out.append(f'<line x1="{left - 4}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#f1f1f1"/>')
    return _Layout(width, height, nw, nh, FONT + 1 if large else FONT - 2, pos, out)


def _curve(d: Drawn, lay: _Layout) -> tuple[np.ndarray, ...] | None:
    """Return the cubic Bezier control points of an edge (sender top to the receiver's port), or None."""
    rn, port = (m.group(1), m.group(2)) if (m := _PORT.match(d.receiver)) else (d.receiver, "")
    if d.sender not in lay.pos or rn not in lay.pos:
        return None
    (xs, ys), (xr, yr) = lay.pos[d.sender], lay.pos[rn]
    xr += PORT_OFFSET.get(port, 0.0) * lay.nw
    y0, y1 = ys - lay.nh / 2, yr + lay.nh / 2
    dy = max((y0 - y1) * 0.45, 10.0)
    return np.array([xs, y0]), np.array([xs, y0 - dy]), np.array([xr, y1 + dy]), np.array([xr, y1])


def _at(c: tuple[np.ndarray, ...], t: float) -> np.ndarray:
    return (1 - t) ** 3 * c[0] + 3 * (1 - t) ** 2 * t * c[1] + 3 * (1 - t) * t ** 2 * c[2] + t ** 3 * c[3]


def _overlaps(box: tuple[float, float, float, float], boxes: list[tuple[float, float, float, float]]) -> bool:
    x0, y0, x1, y1 = box
    return any(x0 < b[2] and b[0] < x1 and y0 < b[3] and b[1] < y1 for b in boxes)


def minority_sign(drawn: list[Drawn]) -> float:
    """Return the sign (+1 or -1) fewer of the circuit's effects have: those edges are drawn dashed."""
    neg = sum(1 for d in drawn if d.ci.value < 0)
    return 1.0 if neg >= len(drawn) - neg else -1.0


def _edges_svg(drawn: list[Drawn], lay: _Layout, labels: int, coloured: bool) -> tuple[list[str], list[str], int]:
    """Return (curves, labels, how many labels fit): least frequent curves first, the most frequent on top."""
    emax = max((abs(d.ci.value) for d in drawn if math.isfinite(d.ci.value)), default=math.nan)
    odd = minority_sign(drawn)
    curves = {i: _curve(d, lay) for i, d in enumerate(drawn)}
    order = sorted(curves, key=lambda i: (drawn[i].frequency if math.isfinite(drawn[i].frequency) else 0.0))
    paths = []
    for i in order:
        d, c = drawn[i], curves[i]
        if c is None:
            continue
        w = 0.8 + 6.2 * abs(d.ci.value) / emax if math.isfinite(d.ci.value) and emax > 0 else 1.5
        col = ramp(BLUES, d.frequency) if coloured else "#888888"
        dash = ' stroke-dasharray="6,3"' if math.isfinite(d.ci.value) and d.ci.value * odd > 0 else ""
        tip = f"#{i + 1} {d.name}\neffect {d.ci.text()}\nq {fmt_p(d.q)}, inclusion frequency {fmt(d.frequency)}"
        p = " ".join(f"{a[0]:.1f},{a[1]:.1f}" for a in c[1:])
        paths.append(f'<path class="edge"{ci_attrs(d.ci)} d="M{c[0][0]:.1f},{c[0][1]:.1f}C{p}" fill="none" '
                     f'stroke="{col}" stroke-width="{w:.2f}" stroke-opacity="0.85"{dash}><title>{esc(tip)}</title></path>')
    boxes = [(x - lay.nw / 2 - 2, y - lay.nh / 2 - 2, x + lay.nw / 2 + 2, y + lay.nh / 2 + 2) for x, y in lay.pos.values()]
    texts, fs = [], lay.font - 1
    for i in range(min(labels, len(drawn))):  # drawn is in rank order: the largest |effect| first
        c = curves[i]
        if c is None:
            continue
        d = drawn[i]
        text = f"{i + 1}: {d.ci.text()}" + ("!" if d.ci.reliable is False else "")
        w, h = 0.54 * fs * len(text) + 6, fs + 4
        for t in LABEL_T:
            x, y = _at(c, t)
            box = (x - w / 2, y - h / 2, x + w / 2, y + h / 2)
            if box[0] >= 0 and box[2] <= lay.width and not _overlaps(box, boxes):
                boxes.append(box)
                texts.append(f'<g class="label"{ci_attrs(d.ci)}><rect x="{box[0]:.1f}" y="{box[1]:.1f}" width="{w:.1f}" '
                             f'height="{h:.1f}" rx="2" fill="#fff" fill-opacity="0.88" stroke="#d0d7de"/>'
                             f'<text x="{x:.1f}" y="{y + fs / 2 - 1.5:.1f}" font-size="{fs:.0f}" text-anchor="middle" '
                             f'fill="#1d1d1f">{esc(text)}</text><title>{esc(d.name)}</title></g>')
                break
    return paths, texts, len(texts)


def _nodes_svg(drawn: list[Drawn], lay: _Layout) -> list[str]:
    """Return the node boxes (nodes outside the circuit greyed out), heads with their q/k/v inputs marked."""
    deg: dict[str, int] = {}
    for d in drawn:
        rn = m.group(1) if (m := _PORT.match(d.receiver)) else d.receiver
        deg[d.sender] = deg.get(d.sender, 0) + 1
        deg[rn] = deg.get(rn, 0) + 1
    out = []
    nw, nh, fs = lay.nw, lay.nh, lay.font
    for n, (x, y) in lay.pos.items():
        on = n in deg
        m = _HEAD.match(n)
        lab = n if (not m or nw >= 5.6 * len(n) + 4) else f"h{m.group(2)}"
        bw = nw if m else max(nw, 0.62 * fs * len(lab) + 8)
        fill, stroke, tc = ("#ffffff", "#333333", "#111") if on else ("#f6f6f6", "#cccccc", "#999")
        ports = ""
        if m and nh >= 24:  # the q/k/v inputs where their edges enter
            ty = y + nh / 2 - 3
            ports = "".join(f'<text x="{x + off * nw:.1f}" y="{ty:.1f}" font-size="8" text-anchor="middle" fill="#888">{p}</text>'
                            for p, off in PORT_OFFSET.items())
        ly = y - 1 if ports else y + fs / 2 - 1
        text = (f'<text x="{x:.1f}" y="{ly:.1f}" font-size="{min(fs, bw / max(len(lab), 1) * 1.7):.1f}" '
                f'text-anchor="middle" fill="{tc}">{esc(lab)}</text>') if bw / max(len(lab), 1) * 1.7 >= 6 else ""
        out.append(f'<g class="node"><rect x="{x - bw / 2:.1f}" y="{y - nh / 2:.1f}" width="{bw:.1f}" height="{nh:.0f}" '
                   f'rx="3" fill="{fill}" stroke="{stroke}"/>{text}{ports}<title>{esc(n)}: {deg.get(n, 0)} circuit edge(s)'
                   "</title></g>")
    return out


def _legend(drawn: list[Drawn], coloured: bool, large: bool) -> list[str]:
    """Return the legends: colour (inclusion frequency), width (|effect|) and dashes (negative)."""
    out = [colour_legend(70 if large else 52, 18, BLUES, 0.0, 1.0, "inclusion frequency", width=150)] if coloured else []
    if not large:  # the compact drawing's caption says what width and dashes mean
        return out
    emax = max((abs(d.ci.value) for d in drawn if math.isfinite(d.ci.value)), default=math.nan)
    if math.isfinite(emax) and emax > 0:
        lx = (70 if large else 52) + (190 if coloured else 0)
        out.append(f'<text x="{lx}" y="14" font-size="{FONT}">|effect|</text>')
        for j, frac in enumerate((0.25, 0.5, 1.0)):
            xx = lx + j * 70
            out.append(f'<line x1="{xx}" x2="{xx + 24}" y1="24" y2="24" stroke="#555" stroke-width="{0.8 + 6.2 * frac:.2f}"/>'
                       f'<text x="{xx + 28}" y="28" font-size="{FONT - 1}">{esc(fmt(emax * frac, 2))}</text>')
        odd = minority_sign(drawn)
        n_odd = sum(1 for d in drawn if d.ci.value * odd > 0)
        out.append(f'<line x1="{lx + 220}" x2="{lx + 246}" y1="24" y2="24" stroke="#555" stroke-width="2" '
                   f'stroke-dasharray="6,3"/><text x="{lx + 250}" y="28" font-size="{FONT - 1}">'
                   f'{"positive" if odd > 0 else "negative"} effect ({n_odd} of {len(drawn)}; the rest solid)</text>')
    return out


def draw_circuit(drawn: list[Drawn], all_nodes: set[str], hint: dict[str, int], label: str, *, width: int,
                 labels: int, coloured: bool) -> tuple[str, str]:
    """Return (svg, note on nodes left out) of the circuit `drawn` (rank order), `width` pixels wide."""
    used = {d.sender for d in drawn} | {(m.group(1) if (m := _PORT.match(d.receiver)) else d.receiver) for d in drawn}
    every = all_nodes | used
    nodes = every if len(every) <= MAX_NODES else used | {n for n in all_nodes if n in ("input", "logits") or _MLP.match(n)}
    info = "" if nodes >= every else f" Only the {len(nodes)} nodes the circuit touches (plus input, MLPs, logits) of {len(every)} are drawn."
    lay = _layout(nodes, hint, width, top=44)
    paths, texts, n_lab = _edges_svg(drawn, lay, labels, coloured)
    if labels and n_lab < min(labels, len(drawn)):
        info += f" {n_lab} of the {min(labels, len(drawn))} largest edges had room for a label; all are in the table."
    body = [svg_open(lay.width, lay.height, label), *lay.rows_svg, *paths, *_nodes_svg(drawn, lay), *texts,
            *_legend(drawn, coloured, width >= 800), "</svg>"]
    return "".join(body), info
