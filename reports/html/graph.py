"""The circuit graph section: the consensus circuit (or the top edges) drawn over the model's layers."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from reports.html.common import (BAR, TOP_FOREST, Missing, Tables, edge_lookup, figure, html_table, ints, methods_in, note,
                                 num, shown, strs, sub)
from reports.html.svg import BLUES, FONT, colour_legend, esc, fmt, fmt_p, ramp, svg_open

CONSENSUS = 0.5  # inclusion frequency of a consensus edge
TOP_TABLE = 40  # circuit edges listed beside the graph
MAX_GRAPH_EDGES = 400
MAX_GRAPH_NODES = 700

_HEAD = re.compile(r"^a(\d+)\.h(\d+)$")
_MLP = re.compile(r"^m(\d+)$")
_PORT = re.compile(r"^(.*)<([^<>]*)>$")
PORT_OFFSET = {"q": -0.28, "k": 0.0, "v": 0.28}


def receiver_node(receiver: str) -> tuple[str, str]:
    """Return (node, port) of a receiver name: 'a1.h3<k>' -> ('a1.h3', 'k'), 'm2' -> ('m2', '')."""
    m = _PORT.match(receiver)
    return (m.group(1), m.group(2)) if m else (receiver, "")


def node_key(name: str, layer_hint: dict[str, int]) -> tuple[float, int, float, str]:
    """Return (layer, sub-row, position, name): input lowest, then per layer heads then MLP, logits top."""
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
    return (layer_hint.get(name, 0), 3, 0, name)


def row_label(key: tuple[float, int]) -> str:
    """Return the label of a graph row: input, logits or 'L<layer> attn|mlp|other'."""
    layer, kind = key
    if layer == -1:
        return "input"
    if layer == math.inf:
        return "logits"
    return f"L{int(layer)} " + {1: "attn", 2: "mlp", 3: "other"}[kind]


def representative_k(T: Tables, method: str, available: Sequence[int]) -> tuple[int, str]:
    """Return (k, why): the largest k with mean Jaccard >= 0.8, else the smallest k."""
    avail = sorted(set(int(k) for k in available))
    st = T.get("stability_vs_k")
    if st is not None and {"method", "k", "jaccard_mean"} <= set(st.column_names):
        s = sub(st, np.array(strs(st, "method")) == method)
        ks, jm = ints(s, "k"), num(s, "jaccard_mean")
        if ks.size:
            good = ks[np.isfinite(jm) & (jm >= BAR)]
            if good.size:
                k, why = int(good.max()), f"the largest k whose mean Jaccard is ≥ {BAR}"
            else:
                k, why = int(ks.min()), f"no k reaches mean Jaccard {BAR}, so the smallest k"
            if k not in avail and avail:
                near = min(avail, key=lambda a: (abs(a - k), a))
                return near, f"{why} is k = {k}, which inclusion.parquet lacks; nearest k"
            return k, why
    return (avail[0] if avail else 0), "stability_vs_k.parquet is missing, so the smallest k"


def graph_section(T: Tables, methods: Sequence[str]) -> str:
    """Return per method the consensus circuit (or the top edges) drawn as a graph beside its table."""
    incl = T.get("inclusion")
    stats = T.get("edge_stats")
    if incl is None and stats is None:
        raise Missing("Neither inclusion.parquet nor edge_stats.parquet is in this run directory, so the circuit graph is omitted.")
    edges = T.get("edges")
    if edges is not None and not {"index", "sender", "receiver"} <= set(edges.column_names):
        edges = None
    layer_hint: dict[str, int] = {}
    if edges is not None:
        idx = ints(edges, "index")
        senders, receivers = strs(edges, "sender"), strs(edges, "receiver")
        names = strs(edges, "name") if "name" in edges.column_names else [f"{s}->{r}" for s, r in zip(senders, receivers)]
        ends = {int(i): (s, r, n) for i, s, r, n in zip(idx, senders, receivers, names)}
        if "sender_layer" in edges.column_names:
            layer_hint.update(zip(senders, ints(edges, "sender_layer").tolist()))
        all_nodes = set(senders) | {receiver_node(r)[0] for r in set(receivers)}
        n_total_edges = edges.num_rows
    else:
        ends, all_nodes, n_total_edges = {}, set(), None

    def endpoints(e: int, name: str) -> tuple[str, str, str] | None:
        if e in ends:
            return ends[e]
        if "->" in name:  # EAP-IG naming sender->receiver
            s, r = name.split("->", 1)
            return s, r, name
        return None

    out = []
    if edges is None:
        out.append(note("edges.parquet is missing: node positions come from the edge names (sender->receiver)."))
    meths = [m for m in methods if m in set(methods_in(incl) or methods_in(stats))] or methods_in(incl) or methods_in(stats)
    for method in meths[:4]:
        chosen: list[tuple[int, str, float]] = []  # (edge, name, frequency)
        if incl is not None and {"method", "k", "edge", "frequency"} <= set(incl.column_names):
            im = sub(incl, np.array(strs(incl, "method")) == method)
            if im.num_rows == 0:
                continue
            kk = ints(im, "k")
            k, why = representative_k(T, method, np.unique(kk).tolist())
            ik = sub(im, kk == k)
            freq = num(ik, "frequency")
            keep = sub(ik, np.isfinite(freq) & (freq >= CONSENSUS))
            chosen = list(zip(ints(keep, "edge").tolist(), strs(keep, "name"), num(keep, "frequency").tolist()))
            what = f"consensus circuit (inclusion frequency ≥ {CONSENSUS}) at k = {k} ({why})"
            coloured = True
        else:
            look = edge_lookup(T, method)
            top = sorted(look, key=lambda e: -abs(look[e][0]) if math.isfinite(look[e][0]) else 0)[:TOP_FOREST]
            st_names = {}
            if stats is not None and "name" in stats.column_names:
                st_names = dict(zip(ints(stats, "edge").tolist(), strs(stats, "name")))
            chosen = [(e, ends[e][2] if e in ends else st_names.get(e, str(e)), math.nan) for e in top]
            what = f"top {len(chosen)} edges by |estimate| (inclusion.parquet is missing, so no consensus circuit)"
            coloured = False
        look = edge_lookup(T, method)
        n_consensus = len(chosen)
        chosen.sort(key=lambda c: (-(c[2] if math.isfinite(c[2]) else 0), -abs(look.get(c[0], (0,))[0] or 0)))
        drawn = chosen[:MAX_GRAPH_EDGES]
        svg, drawn_info = draw_graph(drawn, endpoints, look, all_nodes, layer_hint, coloured, method)
        cols = [("edge", "text"), ("frequency", "num"), ("estimate", "num"), ("CI low", "num"), ("CI high", "num"), ("q", "p")]
        rows = [[name, f, *look.get(e, (math.nan,) * 4)] for e, name, f in chosen[:TOP_TABLE]]
        tbl = html_table(cols, rows, shown_note=shown(len(rows), n_consensus, "circuit edges", "highest frequency first"))
        cap = (
            f"Method {method}: {what}; {n_consensus} edges"
            + (f" of {n_total_edges:,}" if n_total_edges else "")
            + (f", the {len(drawn)} most frequent drawn" if len(drawn) < n_consensus else "")
            + ". Colour = inclusion frequency, width = |estimate|, dashed = negative estimate; "
            "q/k/v inputs of a head enter at its left/middle/right. Hover for values."
            + drawn_info
        )
        out.append(f"<h3>{esc(method)}</h3>" + figure(svg, cap, tbl))
    if not out or all(o.startswith('<p class="note">') for o in out):
        raise Missing("The inclusion/edge tables have no rows for any method, so the circuit graph is omitted.")
    return "".join(out)


Segment = tuple[str, str, str, int, str, float]  # (sender node, receiver node, port, edge, name, frequency)


def draw_graph(drawn, endpoints: Callable, look: dict, all_nodes: set[str], layer_hint: dict[str, int], coloured: bool,
               method: str) -> tuple[str, str]:
    """Return (svg, note on the nodes left out) of the circuit `drawn`: nodes in layer rows, edges as curves."""
    segs: list[Segment] = []
    for e, name, f in drawn:
        ep = endpoints(e, name)
        if ep is None:
            continue
        s, r, nm = ep
        rn, port = receiver_node(r)
        segs.append((s, rn, port, e, nm or name, f))
    used = {s for s, *_ in segs} | {r for _, r, *_ in segs}
    nodes = set(all_nodes) | used if len(all_nodes | used) <= MAX_GRAPH_NODES else used | {n for n in all_nodes if n in ("input", "logits") or _MLP.match(n)}
    info = "" if nodes >= all_nodes else f" Only the {len(nodes)} nodes touched by the circuit (plus input, MLPs, logits) of {len(all_nodes)} are drawn."
    lay = _layout(nodes, layer_hint)
    svg = [svg_open(lay.width, lay.height, f"circuit graph, method {method}"), *lay.rows_svg]
    ests = np.array([abs(look.get(e, (math.nan,))[0]) for *_, e, _, _ in segs], dtype=float)
    emax = np.nanmax(ests) if ests.size and np.isfinite(ests).any() else math.nan
    svg += _edge_paths(segs, look, lay, emax, coloured)
    svg += _node_boxes(segs, used, lay)
    svg += _legends(lay.left, emax, coloured)
    svg.append("</svg>")
    return "".join(svg), info


@dataclass
class _Layout:
    """Where draw_graph puts things: the canvas, the node box size, each node's centre and the row labels."""

    width: int
    height: float
    left: int
    right: int
    nw: float  # node box width (head boxes; other nodes widen to their label)
    nh: int  # node box height
    pos: dict[str, tuple[float, float]]
    rows_svg: list[str]


def _layout(nodes: set[str], layer_hint: dict[str, int]) -> _Layout:
    """Return the layout of `nodes`: one row per layer and kind (input at the bottom, logits at the top)."""
    rows: dict[tuple[float, int], list[str]] = {}
    for n in nodes:
        key = node_key(n, layer_hint)
        rows.setdefault(key[:2], []).append(n)
    row_keys = sorted(rows)
    for k in row_keys:
        rows[k].sort(key=lambda n: node_key(n, layer_hint)[2:])
    left, right = 78, 20
    widest = max(len(v) for v in rows.values()) if rows else 1
    width = max(660, min(920, left + right + widest * 70))
    sx = min(70.0, (width - left - right) / max(widest, 1))
    nw = max(min(sx * 0.78, 46), 4)
    nh = 16
    n_rows = len(row_keys)
    rh = 38 if n_rows <= 26 else max(20, 1000 / n_rows)
    legend_h = 56
    height = legend_h + n_rows * rh + 16
    pos: dict[str, tuple[float, float]] = {}
    rows_svg = []
    for i, key in enumerate(row_keys):
        y = height - 16 - (i + 0.5) * rh
        ns = rows[key]
        x0 = left + (width - left - right - sx * len(ns)) / 2 + sx / 2
        for j, n in enumerate(ns):
            pos[n] = (x0 + j * sx, y)
        rows_svg.append(f'<text x="4" y="{y + 4:.1f}" font-size="{FONT - 1}" fill="#555">{esc(row_label(key))}</text>')
        rows_svg.append(f'<line x1="{left - 6}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#f3f3f3"/>')
    return _Layout(width, height, left, right, nw, nh, pos, rows_svg)


def _edge_paths(segs: list[Segment], look: dict, lay: _Layout, emax: float, coloured: bool) -> list[str]:
    """Return the edges as curves, least frequent first (the most frequent on top)."""
    out = []
    pos, nw, nh = lay.pos, lay.nw, lay.nh
    order = sorted(range(len(segs)), key=lambda i: (segs[i][5] if math.isfinite(segs[i][5]) else 0))
    for i in order:
        s, rn, port, e, nm, f = segs[i]
        if s not in pos or rn not in pos:
            continue
        (xs, ys), (xr, yr) = pos[s], pos[rn]
        xr += PORT_OFFSET.get(port, 0.0) * nw
        ys0, yr0 = ys - nh / 2, yr + nh / 2
        dy = max((ys0 - yr0) * 0.45, 10)
        est = look.get(e, (math.nan,) * 4)
        w = 0.8 + 5.2 * (abs(est[0]) / emax) if math.isfinite(est[0]) and emax > 0 else 1.5
        col = ramp(BLUES, (f - CONSENSUS) / (1 - CONSENSUS)) if coloured else "#888888"
        dash = ' stroke-dasharray="5,3"' if math.isfinite(est[0]) and est[0] < 0 else ""
        tip = f"{nm}\nfrequency {fmt(f)}\nestimate {fmt(est[0])} [{fmt(est[1])}, {fmt(est[2])}]\nq {fmt_p(est[3])}"
        out.append(
            f'<path class="edge" d="M{xs:.1f},{ys0:.1f}C{xs:.1f},{ys0 - dy:.1f} {xr:.1f},{yr0 + dy:.1f} {xr:.1f},{yr0:.1f}" '
            f'fill="none" stroke="{col}" stroke-width="{w:.2f}" stroke-opacity="0.85"{dash}><title>{esc(tip)}</title></path>'
        )
    return out


def _node_boxes(segs: list[Segment], used: set[str], lay: _Layout) -> list[str]:
    """Return the node boxes with their labels (nodes outside the circuit greyed out)."""
    deg: dict[str, int] = {}
    for s, rn, *_ in segs:
        deg[s] = deg.get(s, 0) + 1
        deg[rn] = deg.get(rn, 0) + 1
    out = []
    nw, nh = lay.nw, lay.nh
    for n, (x, y) in lay.pos.items():
        on = n in used
        m = _HEAD.match(n)
        lab = f"h{m.group(2)}" if m else n
        fs = min(FONT - 1, nw / max(len(lab), 1) * 1.7)
        fill, stroke, tc = ("#ffffff", "#333333", "#111") if on else ("#f5f5f5", "#cccccc", "#999")
        bw = nw if m else max(nw, len(lab) * 6.5 + 6)
        out.append(
            f'<g class="node"><rect x="{x - bw / 2:.1f}" y="{y - nh / 2:.1f}" width="{bw:.1f}" height="{nh}" rx="3" fill="{fill}" stroke="{stroke}"/>'
            + (f'<text x="{x:.1f}" y="{y + 3.5:.1f}" font-size="{fs:.1f}" text-anchor="middle" fill="{tc}">{esc(lab)}</text>' if fs >= 6 else "")
            + f"<title>{esc(n)}: {deg.get(n, 0)} circuit edge(s)</title></g>"
        )
    return out


def _legends(left: int, emax: float, coloured: bool) -> list[str]:
    """Return the legends: colour (inclusion frequency) and width (|estimate|, dashed when negative)."""
    out = []
    if coloured:
        out.append(colour_legend(left, 18, BLUES, CONSENSUS, 1.0, "inclusion frequency"))
    if math.isfinite(emax) and emax > 0:
        lx = left + 220
        out.append(f'<text x="{lx}" y="14" font-size="{FONT}">|estimate|</text>')
        for j, frac in enumerate((0.25, 0.5, 1.0)):
            xx = lx + j * 80
            out.append(
                f'<line x1="{xx}" x2="{xx + 26}" y1="24" y2="24" stroke="#555" stroke-width="{0.8 + 5.2 * frac:.2f}"/>'
                f'<text x="{xx + 30}" y="28" font-size="{FONT - 1}">{esc(fmt(emax * frac, 2))}</text>'
            )
        out.append(
            f'<line x1="{lx + 250}" x2="{lx + 276}" y1="24" y2="24" stroke="#555" stroke-width="2" stroke-dasharray="5,3"/>'
            f'<text x="{lx + 280}" y="28" font-size="{FONT - 1}">negative</text>'
        )
    return out
