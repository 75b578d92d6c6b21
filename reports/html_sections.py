"""The sections of the HTML report, each built from the run directory's Parquet tables.

Each section reads the tables it needs through `Tables`; a missing table or column raises
`Missing`, which the page turns into a short note in place of that section (or sub-section).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from reports.html_svg import (
    BLUES,
    FONT,
    PALETTE,
    VIRIDIS,
    Plot,
    colour_legend,
    data_range,
    esc,
    finite,
    fmt,
    fmt_p,
    nice_domain,
    padded,
    ramp,
    svg_open,
    text_colour,
    use_log,
)
from reports.tables import read_table

BAR = 0.8  # the mean-Jaccard bar of the stability section (the variance section reads its bar from its table)
CONSENSUS = 0.5  # inclusion frequency of a consensus edge
TOP_FOREST = 20
TOP_TABLE = 40
MAX_ROWS = 200
MAX_GRAPH_EDGES = 400
MAX_GRAPH_NODES = 700
MAX_SCATTER_POINTS = 2000


class Missing(Exception):
    """A table or column a section needs is not in the run directory; the message is the note shown."""


# ----- data access ------------------------------------------------------------------------------
class Tables:
    """Lazily read, cached Parquet tables of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self._cache: dict[str, pa.Table | None] = {}

    def path(self, name: str) -> Path:
        return self.dir / f"{name}.parquet"

    def get(self, name: str) -> pa.Table | None:
        if name not in self._cache:
            p = self.path(name)
            self._cache[name] = read_table(p) if p.exists() else None
        return self._cache[name]

    def need(self, name: str, columns: Sequence[str] = ()) -> pa.Table:
        t = self.get(name)
        if t is None:
            raise Missing(f"{name}.parquet is not in this run directory, so this part is omitted.")
        lacking = [c for c in columns if c not in t.column_names]
        if lacking:
            raise Missing(f"{name}.parquet lacks column(s) {', '.join(lacking)}, so this part is omitted.")
        if t.num_rows == 0:
            raise Missing(f"{name}.parquet is empty, so this part is omitted.")
        return t


def num(t: pa.Table, col: str) -> np.ndarray:
    """Return column `col` as float64 (nulls and absent columns -> NaN)."""
    if col not in t.column_names:
        return np.full(t.num_rows, np.nan)
    c = t.column(col)
    if pa.types.is_boolean(c.type):
        c = c.cast(pa.int8())
    return c.cast(pa.float64()).to_numpy(zero_copy_only=False)


def ints(t: pa.Table, col: str) -> np.ndarray:
    """Return column `col` as int64 (nulls -> -1)."""
    c = t.column(col)
    return c.cast(pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)


def strs(t: pa.Table, col: str) -> list[str]:
    """Return column `col` as Python strings (nulls and absent columns -> '')."""
    if col not in t.column_names:
        return [""] * t.num_rows
    return ["" if v is None else str(v) for v in t.column(col).to_pylist()]


def sub(t: pa.Table, mask: np.ndarray) -> pa.Table:
    return t.filter(pa.array(np.asarray(mask, dtype=bool)))


def methods_in(t: pa.Table | None) -> list[str]:
    if t is None or "method" not in t.column_names:
        return []
    return list(dict.fromkeys(strs(t, "method")))


def order_methods(names: Sequence[str]) -> list[str]:
    """Return methods with 'exact' first, then in order of first appearance."""
    uniq = list(dict.fromkeys(n for n in names if n))
    return sorted(uniq, key=lambda m: (m != "exact", uniq.index(m)))


def edge_lookup(T: Tables, method: str | None = None) -> dict[int, tuple[float, float, float, float]]:
    """Return {edge: (estimate, ci_low, ci_high, q)} from edge_stats for `method` ({} when absent)."""
    t = T.get("edge_stats")
    if t is None or "edge" not in t.column_names or "estimate" not in t.column_names:
        return {}
    if method is not None and "method" in t.column_names:
        t = sub(t, np.array(strs(t, "method")) == method)
    e = ints(t, "edge")
    cols = [num(t, c) for c in ("estimate", "ci_low", "ci_high", "q")]
    return {int(k): (a, b, c, d) for k, a, b, c, d in zip(e, *cols)}


# ----- HTML pieces ------------------------------------------------------------------------------
def note(text: str, cls: str = "note") -> str:
    return f'<p class="{cls}">{esc(text)}</p>'


def figure(svg: str, caption: str, table: str = "") -> str:
    """Return a plot with its caption and, beside it, the table of its numbers."""
    side = f'<div class="tablebox">{table}</div>' if table else ""
    return f'<div class="row"><figure>{svg}<figcaption>{esc(caption)}</figcaption></figure>{side}</div>'


Col = tuple[str, str]  # (header, kind): kind is text | num | int | p | bool


def html_table(cols: Sequence[Col], rows: Sequence[Sequence[Any]], *, shown_note: str = "", cls: str = "") -> str:
    """Return a sortable table; numbers are rounded for display and kept exact in data-v for sorting."""
    head = "".join(f'<th class="{"t" if k in ("text", "bool") else "n"}" title="click to sort">{esc(h)}</th>' for h, k in cols)
    body = []
    for r in rows:
        cells = []
        for (_h, kind), v in zip(cols, r):
            if kind == "text":
                cells.append(f"<td>{esc(v)}</td>")
                continue
            if kind == "bool":
                ok = bool(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else None
                txt = "—" if ok is None else ("yes" if ok else "no")
                c = "" if ok is None else (' class="pass"' if ok else ' class="fail"')
                cells.append(f'<td{c} data-v="{"" if ok is None else int(ok)}">{txt}</td>')
                continue
            try:
                f = float(v)
            except (TypeError, ValueError):
                f = math.nan
            dv = "" if math.isnan(f) else (str(int(f)) if kind == "int" else f"{f:.6g}")
            txt = fmt_p(f) if kind == "p" else (str(int(f)) if kind == "int" and not math.isnan(f) else fmt(f))
            cells.append(f'<td class="n" data-v="{dv}">{esc(txt)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    extra = f'<p class="shown">{esc(shown_note)}</p>' if shown_note else ""
    return f'<table class="sortable {cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{extra}'


def shown(n_shown: int, n_total: int, what: str, order: str) -> str:
    if n_shown >= n_total:
        return f"all {n_total:,} {what}"
    return f"showing {n_shown:,} of {n_total:,} {what} ({order})"


def colours(methods: Sequence[str]) -> dict[str, str]:
    return {m: PALETTE[i % len(PALETTE)] for i, m in enumerate(methods)}


def k_ticks(ks: np.ndarray, plot: Plot) -> list[float] | None:
    """Return the k grid itself as ticks when it is short (reads better than generic ticks)."""
    u = np.unique(ks[np.isfinite(ks)])
    if 1 < u.size <= 9:
        # drop ticks that would overlap on the axis
        out, last = [], -1e9
        for v in u:
            px = plot.x(float(v))
            if px - last >= 24:
                out.append(float(v))
                last = px
        return out
    return None


def x_domain_k(ks: np.ndarray) -> tuple[tuple[float, float], bool]:
    lo, hi = data_range(ks)
    log = use_log(ks)
    if log:
        return (lo / 1.15, hi * 1.15), True
    return padded(lo, hi, 0.04), False


# ----- (1) circuit graph ------------------------------------------------------------------------
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


def draw_graph(drawn, endpoints: Callable, look: dict, all_nodes: set[str], layer_hint: dict[str, int], coloured: bool, method: str) -> tuple[str, str]:
    segs = []  # (sender node, receiver node, port, edge, name, freq)
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
    svg = [svg_open(width, height, f"circuit graph, method {method}")]
    for i, key in enumerate(row_keys):
        y = height - 16 - (i + 0.5) * rh
        ns = rows[key]
        x0 = left + (width - left - right - sx * len(ns)) / 2 + sx / 2
        for j, n in enumerate(ns):
            pos[n] = (x0 + j * sx, y)
        svg.append(f'<text x="4" y="{y + 4:.1f}" font-size="{FONT - 1}" fill="#555">{esc(row_label(key))}</text>')
        svg.append(f'<line x1="{left - 6}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#f3f3f3"/>')
    ests = np.array([abs(look.get(e, (math.nan,))[0]) for *_, e, _, _ in segs], dtype=float)
    emax = np.nanmax(ests) if ests.size and np.isfinite(ests).any() else math.nan
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
        svg.append(
            f'<path class="edge" d="M{xs:.1f},{ys0:.1f}C{xs:.1f},{ys0 - dy:.1f} {xr:.1f},{yr0 + dy:.1f} {xr:.1f},{yr0:.1f}" '
            f'fill="none" stroke="{col}" stroke-width="{w:.2f}" stroke-opacity="0.85"{dash}><title>{esc(tip)}</title></path>'
        )
    deg: dict[str, int] = {}
    for s, rn, *_ in segs:
        deg[s] = deg.get(s, 0) + 1
        deg[rn] = deg.get(rn, 0) + 1
    for n, (x, y) in pos.items():
        on = n in used
        m = _HEAD.match(n)
        lab = f"h{m.group(2)}" if m else n
        fs = min(FONT - 1, nw / max(len(lab), 1) * 1.7)
        fill, stroke, tc = ("#ffffff", "#333333", "#111") if on else ("#f5f5f5", "#cccccc", "#999")
        bw = nw if m else max(nw, len(lab) * 6.5 + 6)
        svg.append(
            f'<g class="node"><rect x="{x - bw / 2:.1f}" y="{y - nh / 2:.1f}" width="{bw:.1f}" height="{nh}" rx="3" fill="{fill}" stroke="{stroke}"/>'
            + (f'<text x="{x:.1f}" y="{y + 3.5:.1f}" font-size="{fs:.1f}" text-anchor="middle" fill="{tc}">{esc(lab)}</text>' if fs >= 6 else "")
            + f"<title>{esc(n)}: {deg.get(n, 0)} circuit edge(s)</title></g>"
        )
    # legends: colour (frequency) and width (|estimate|)
    if coloured:
        svg.append(colour_legend(left, 18, BLUES, CONSENSUS, 1.0, "inclusion frequency"))
    if math.isfinite(emax) and emax > 0:
        lx = left + 220
        svg.append(f'<text x="{lx}" y="14" font-size="{FONT}">|estimate|</text>')
        for j, frac in enumerate((0.25, 0.5, 1.0)):
            xx = lx + j * 80
            svg.append(
                f'<line x1="{xx}" x2="{xx + 26}" y1="24" y2="24" stroke="#555" stroke-width="{0.8 + 5.2 * frac:.2f}"/>'
                f'<text x="{xx + 30}" y="28" font-size="{FONT - 1}">{esc(fmt(emax * frac, 2))}</text>'
            )
        svg.append(
            f'<line x1="{lx + 250}" x2="{lx + 276}" y1="24" y2="24" stroke="#555" stroke-width="2" stroke-dasharray="5,3"/>'
            f'<text x="{lx + 280}" y="28" font-size="{FONT - 1}">negative</text>'
        )
    svg.append("</svg>")
    return "".join(svg), info


# ----- (2) Jaccard vs k -------------------------------------------------------------------------
STAB_COLS = [
    ("method", "text"), ("k", "int"), ("mean J", "num"), ("SD", "num"), ("CI low", "num"), ("CI high", "num"),
    ("chance", "num"), ("corrected", "num"), ("Φ", "num"), ("Φ CI low", "num"), ("Φ CI high", "num"),
    ("consensus size", "int"), ("consensus mean J", "num"),
]
STAB_SRC = ["jaccard_mean", "jaccard_sd", "jaccard_ci_low", "jaccard_ci_high", "jaccard_chance", "jaccard_corrected",
            "phi", "phi_ci_low", "phi_ci_high", "consensus_size", "consensus_jaccard_mean"]


def stability_section(T: Tables, methods: Sequence[str]) -> str:
    t = T.need("stability_vs_k", ["method", "k", "jaccard_mean"])
    meth = [m for m in methods if m in methods_in(t)]
    col = colours(methods)
    ms = np.array(strs(t, "method"))
    ks = num(t, "k")
    xd, xlog = x_domain_k(ks)
    p = Plot(600, 360, xd, (0, 1.0), xlog=xlog, label="mean pairwise Jaccard vs k")
    rows = []
    for m in meth:
        mask = ms == m
        s = sub(t, mask)
        o = np.argsort(num(s, "k"), kind="stable")
        k = num(s, "k")[o]
        v = {c: num(s, c)[o] for c in STAB_SRC}
        p.band(k, v["jaccard_ci_low"], v["jaccard_ci_high"], col[m])
        p.line(k, v["jaccard_chance"], col[m], width=1.2, dash="1.5,2.5", title=f"{m}: chance")
        p.line(k, v["jaccard_mean"], col[m], title=f"{m}: mean Jaccard")
        p.points(k, v["jaccard_mean"], col[m], r=2.8,
                 titles=[f"{m} k={fmt(a)}: mean J {fmt(b)} [{fmt(c)}, {fmt(d)}], chance {fmt(e)}"
                         for a, b, c, d, e in zip(k, v["jaccard_mean"], v["jaccard_ci_low"], v["jaccard_ci_high"], v["jaccard_chance"])])
        p.legend(f"{m}: mean Jaccard + CI", col[m])
        rows += [[m, a, *(v[c][i] for c in STAB_SRC)] for i, a in enumerate(k)]
    p.legend("chance (hypergeometric)", "#555", "dot")
    p.legend(f"bar: {BAR}", "#b00", "dash")
    p.hline(BAR, "#b00", dash="6,4")
    p.axes("circuit size k (edges)" + (", log scale" if xlog else ""), "mean pairwise Jaccard", xticks=k_ticks(ks, p), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    tbl = html_table(STAB_COLS, rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    cap = (f"Mean pairwise Jaccard of the top-k circuits across resamples, per method, with its CI band; dotted: the "
           f"chance level; dashed red: the {BAR} bar. Table: also the chance-corrected Jaccard, Nogueira's Φ and the consensus size.")
    return figure(p.svg(), cap, tbl)


# ----- (3) forest plot --------------------------------------------------------------------------
def forest_section(T: Tables, methods: Sequence[str]) -> str:
    t = T.need("edge_stats", ["method", "edge", "estimate", "ci_low", "ci_high"])
    meth = [m for m in methods if m in methods_in(t)]
    ref = meth[0]
    ms = np.array(strs(t, "method"))
    r = sub(t, ms == ref)
    est = num(r, "estimate")
    ok = np.isfinite(est)
    n_edges = int(ok.sum())
    order = np.argsort(-np.abs(np.where(ok, est, 0)), kind="stable")[: min(TOP_FOREST, n_edges)]
    redge = ints(r, "edge")
    top = redge[order]
    rnames = strs(r, "name")
    name_of = {int(redge[i]): (rnames[i] or str(int(redge[i]))) for i in order}
    per: dict[str, dict[int, tuple[float, ...]]] = {}
    for m in meth:
        s = sub(t, (ms == m) & np.isin(ints(t, "edge"), top))
        cols_ = [num(s, c) for c in ("estimate", "se", "ci_low", "ci_high", "p", "q", "n")]
        per[m] = {int(e): tuple(float(c[i]) for c in cols_) for i, e in enumerate(ints(s, "edge"))}
    n = len(top)
    col = colours(methods)
    nm = len(meth)
    band = min(0.7, 0.22 * nm)
    offs = [(j - (nm - 1) / 2) * (band / max(nm - 1, 1)) if nm > 1 else 0.0 for j in range(nm)]
    lo, hi = data_range(*[[v[2] for v in per[m].values()] + [v[3] for v in per[m].values()] + [v[0] for v in per[m].values()] for m in meth], [0.0])
    xd = nice_domain(*padded(lo, hi, 0.03))
    height = 60 + n * max(16, 9 * nm + 6)
    p = Plot(640, height, xd, (-0.6, n - 0.4), margin=(14, 74, 42, 200), label="forest plot of top edges")
    p.vline(0.0, "#777", dash=None)
    rows = []
    for j, m in enumerate(meth):
        for i, e in enumerate(top.tolist()):
            v = per[m].get(e)
            if v is None:
                continue
            y = n - 1 - i - offs[j]  # first method on top
            estv, se, cl, ch, pv, qv, nn = v
            p.hbar(y, cl, ch, col[m])
            p.points([estv], [y], col[m], r=3.2, titles=[f"{name_of.get(e, e)} ({m}): {fmt(estv)} [{fmt(cl)}, {fmt(ch)}], q = {fmt_p(qv)}"])
            p.raw(f'<text x="{p.right + 6:.1f}" y="{p.y(y) + 3:.1f}" font-size="{FONT - 2}" fill="{col[m]}">q={esc(fmt_p(qv))}</text>')
            rows.append([name_of.get(e, str(e)), m, estv, se, cl, ch, pv, qv, nn])
        p.legend(m, col[m], "point")
    labels = [name_of.get(e, str(e)) for e in top.tolist()]
    short = [s if len(s) <= 30 else s[:29] + "…" for s in labels]
    p.axes("estimate with CI", "", yticks=[n - 1 - i for i in range(n)], ytick_labels=short)
    rows.sort(key=lambda r: (labels.index(r[0]) if r[0] in labels else 0, meth.index(r[1])))
    cols = [("edge", "text"), ("method", "text"), ("estimate", "num"), ("SE", "num"), ("CI low", "num"), ("CI high", "num"), ("p", "p"), ("q (BH)", "p"), ("n", "int")]
    tbl = html_table(cols, rows, shown_note=shown(n, n_edges, "edges", f"top by |estimate| of {ref}"))
    cap = (f"Top {n} edges by |estimate| of {ref}, each with its CI per method; q = Benjamini–Hochberg adjusted p-value. "
           "The vertical line marks zero effect.")
    return figure(p.svg(), cap, tbl)


# ----- (4) approximation scatter ----------------------------------------------------------------
def approximation_section(T: Tables, methods: Sequence[str]) -> str:
    t = T.need("approximation", ["method", "exact_mean", "approx_mean"])
    summ = T.get("approximation_summary")
    sm: dict[str, dict[str, float]] = {}
    if summ is not None and "method" in summ.column_names:
        for i, m in enumerate(strs(summ, "method")):
            sm[m] = {c: float(num(summ, c)[i]) for c in ("spearman", "kendall", "slope", "r2", "bias_mean", "top_k_overlap", "k")}
    meth = order_methods([m for m in methods if m in methods_in(t)] + methods_in(t))
    col = colours(methods)
    ms = np.array(strs(t, "method"))
    figs, srows, erows = [], [], []
    for m in meth:
        s = sub(t, ms == m)
        x, y = num(s, "exact_mean"), num(s, "approx_mean")
        names = strs(s, "name")
        ok = finite(x, y)
        lo, hi = data_range(x[ok], y[ok])
        d = nice_domain(*padded(lo, hi, 0.04))
        p = Plot(340, 340, d, d, margin=(14, 14, 42, 58), label=f"exact vs {m}")
        p.line(list(d), list(d), "#999", width=1.0, dash="4,3", title="y = x")
        n_ok = int(ok.sum())
        if n_ok > MAX_SCATTER_POINTS:
            bins = 48
            h, xe, ye = np.histogram2d(x[ok], y[ok], bins=bins, range=[d, d])
            hmax = np.log1p(h.max())
            for i, j in zip(*np.nonzero(h)):
                c = ramp(("#dfe7f2", col[m]), float(np.log1p(h[i, j]) / hmax))
                x0, x1, y0, y1 = p.x(xe[i]), p.x(xe[i + 1]), p.y(ye[j + 1]), p.y(ye[j])
                p.raw(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0 + 0.3:.1f}" height="{y1 - y0 + 0.3:.1f}" fill="{c}"/>')
            top = np.flatnonzero(ok)[np.argsort(-np.abs(x[ok]))[:150]]
            p.points(x[top], y[top], col[m], r=2.4, titles=[f"{names[i]}: exact {fmt(x[i])}, {m} {fmt(y[i])}" for i in top])
            drawn = f"{n_ok:,} edges as a density (darker = more) plus the 150 largest |exact| as points"
        else:
            if n_ok <= 400:
                p.points(x, y, col[m], r=2.6, opacity=0.75, titles=[f"{nme}: exact {fmt(a)}, {m} {fmt(b)}" for nme, a, b in zip(names, x, y)])
            else:
                p.points(x, y, col[m], r=2.2, opacity=0.6)
            drawn = f"{n_ok:,} edges"
        st = sm.get(m, {})
        slope, r2 = st.get("slope", math.nan), st.get("r2", math.nan)
        src = "approximation_summary"
        if not math.isfinite(slope) and n_ok >= 2:
            slope, intercept = np.polyfit(x[ok], y[ok], 1)
            r2 = float(np.corrcoef(x[ok], y[ok])[0, 1] ** 2)
            src = "least squares here (approximation_summary is missing)"
        if math.isfinite(slope) and n_ok:
            intercept = float(np.mean(y[ok]) - slope * np.mean(x[ok]))
            p.line(list(d), [intercept + slope * d[0], intercept + slope * d[1]], col[m], width=1.2, title=f"fit: slope {fmt(slope)}")
        p.axes("exact (mean over examples)", f"{m} (mean over examples)")
        cap = (f"{m} vs exact: {drawn}; dashed: y = x; solid: fit. Slope {fmt(slope)}, R² {fmt(r2)}"
               + (f", Spearman {fmt(st['spearman'])}, Kendall {fmt(st['kendall'])}" if st else "") + f" (from {src}).")
        figs.append(f'<figure>{p.svg()}<figcaption>{esc(cap)}</figcaption></figure>')
        if st:
            srows.append([m, st["spearman"], st["kendall"], st["slope"], st["r2"], st["bias_mean"], st["top_k_overlap"], st["k"]])
        bias = num(s, "bias")
        if not np.isfinite(bias).any():
            bias = y - x
        o = np.argsort(-np.abs(np.where(np.isfinite(bias), bias, 0)), kind="stable")[:10]
        for i in o:
            erows.append([m, names[i], x[i], y[i], bias[i], num(s, "error_sd")[i], num(s, "slope")[i], num(s, "r2")[i]])
    tables = []
    if srows:
        tables.append(html_table([("method", "text"), ("Spearman", "num"), ("Kendall", "num"), ("slope", "num"), ("R²", "num"),
                                  ("mean bias", "num"), ("top-k overlap", "num"), ("k", "int")], srows))
    else:
        tables.append(note("approximation_summary.parquet is missing: no rank agreement summary."))
    tables.append(html_table([("method", "text"), ("edge", "text"), ("exact", "num"), ("approx", "num"), ("bias", "num"),
                              ("error SD", "num"), ("per-input slope", "num"), ("per-input R²", "num")], erows,
                             shown_note="per method, the 10 edges with the largest |bias| (approx − exact)"))
    return f'<div class="row">{"".join(figs)}<div class="tablebox">{"".join(tables)}</div></div>'


# ----- (5) faithfulness -------------------------------------------------------------------------
def faithfulness_section(T: Tables, methods: Sequence[str]) -> str:
    t = T.need("faithfulness_vs_k", ["method", "k", "f_mean"])
    meth = [m for m in methods if m in methods_in(t)]
    col = colours(methods)
    ms = np.array(strs(t, "method"))
    ks = num(t, "k")
    xd, xlog = x_domain_k(ks)
    lo, hi = data_range(num(t, "f_ci_low"), num(t, "f_ci_high"), num(t, "f_mean"), num(t, "f_ratio"), [0.0, 1.0])
    yd = nice_domain(*padded(lo, hi, 0.03))
    p = Plot(600, 360, xd, yd, xlog=xlog, label="faithfulness vs k")
    p.hline(1.0, "#555", dash="2,3", label="full model")
    p.hline(0.0, "#999", dash=None)
    rows, caps = [], []
    for m in meth:
        s = sub(t, ms == m)
        o = np.argsort(num(s, "k"), kind="stable")
        k = num(s, "k")[o]
        v = {c: num(s, c)[o] for c in ("edge_fraction", "f_ratio", "f_mean", "f_ci_low", "f_ci_high", "cpr", "cmd")}
        p.band(k, v["f_ci_low"], v["f_ci_high"], col[m])
        p.line(k, v["f_ratio"], col[m], width=1.3, dash="6,3", title=f"{m}: ratio of means")
        p.line(k, v["f_mean"], col[m], title=f"{m}: mean per-example faithfulness")
        p.points(k, v["f_mean"], col[m], r=2.6, titles=[f"{m} k={fmt(a)}: f {fmt(b)} [{fmt(c)}, {fmt(d)}], ratio {fmt(e)}"
                                                         for a, b, c, d, e in zip(k, v["f_mean"], v["f_ci_low"], v["f_ci_high"], v["f_ratio"])])
        p.legend(f"{m}: mean f + CI", col[m])
        p.legend(f"{m}: ratio of means", col[m], "dash")
        cpr, cmd = v["cpr"][0] if len(k) else math.nan, v["cmd"][0] if len(k) else math.nan
        caps.append(f"{m}: CPR {fmt(cpr)}, CMD {fmt(cmd)}")
        rows += [[m, k[i], v["edge_fraction"][i], v["f_ratio"][i], v["f_mean"][i], v["f_ci_low"][i], v["f_ci_high"][i]] for i in range(len(k))]
    p.axes("circuit size k (edges)" + (", log scale" if xlog else ""), "faithfulness f", xticks=k_ticks(ks, p))
    cols = [("method", "text"), ("k", "int"), ("edge fraction", "num"), ("f (ratio of means)", "num"), ("f mean", "num"), ("CI low", "num"), ("CI high", "num")]
    tbl = html_table(cols, rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    cap = ("Faithfulness of the top-k circuit: mean per-example f with its CI band (solid) and the ratio of means (dashed). "
           + "; ".join(caps) + " (CPR: area under f, higher is better; CMD: area under |1 − f|, lower is better).")
    return figure(p.svg(), cap, tbl)


# ----- (6) heads, layers, residual --------------------------------------------------------------
def heatmap(values: np.ndarray, tips: list[list[str]], label: str, lo: float, hi: float) -> str:
    n_layers, n_heads = values.shape
    c = max(8.0, min(34.0, 520 / max(n_heads, 1), 520 / max(n_layers, 1)))
    left, top, bottom = 48, 40, 40
    width = left + n_heads * c + 20
    width = max(width, 260)
    height = top + n_layers * c + bottom
    parts = [svg_open(width, height, label)]
    for li in range(n_layers):
        y = top + (n_layers - 1 - li) * c
        for h in range(n_heads):
            v = values[li, h]
            if not math.isfinite(v):
                fill = "#eeeeee"
            else:
                fill = ramp(VIRIDIS, (v - lo) / (hi - lo) if hi > lo else 0.5)
            x = left + h * c
            txt = ""
            if c >= 26 and math.isfinite(v):
                txt = f'<text x="{x + c / 2:.1f}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 2}" text-anchor="middle" fill="{text_colour(fill)}">{esc(fmt(v, 2))}</text>'
            parts.append(f'<g><rect x="{x:.1f}" y="{y:.1f}" width="{c:.1f}" height="{c:.1f}" fill="{fill}" stroke="#fff" stroke-width="0.5"/>{txt}<title>{esc(tips[li][h])}</title></g>')
        if n_layers <= 40 or li % 2 == 0:
            parts.append(f'<text x="{left - 5}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 1}" text-anchor="end">{li}</text>')
    step = 1 if c >= 14 else (2 if c >= 8 else 4)
    for h in range(0, n_heads, step):
        parts.append(f'<text x="{left + h * c + c / 2:.1f}" y="{top + n_layers * c + 13:.1f}" font-size="{FONT - 1}" text-anchor="middle">{h}</text>')
    parts.append(f'<text x="{left + n_heads * c / 2:.1f}" y="{height - 6:.1f}" font-size="{FONT}" text-anchor="middle">head</text>')
    parts.append(f'<text transform="translate(13,{top + n_layers * c / 2:.1f}) rotate(-90)" font-size="{FONT}" text-anchor="middle">layer</text>')
    parts.append(colour_legend(left, 16, VIRIDIS, lo, hi, label, width=min(160, width - left - 10)))
    parts.append("</svg>")
    return "".join(parts)


def heads_part(T: Tables) -> str:
    t = T.need("heads", ["layer", "head", "stability"])
    L, H = ints(t, "layer"), ints(t, "head")
    n_layers, n_heads = int(L.max()) + 1, int(H.max()) + 1
    cols = {c: num(t, c) for c in ("stability", "ci_low", "ci_high", "null_mean", "distinctness", "importance")}
    match, pairs = strs(t, "match"), strs(t, "pairs")
    figs = []
    for c, lab in (("stability", "head stability"), ("distinctness", "distinctness"), ("importance", "importance (Δ perplexity)")):
        v = cols[c]
        if not np.isfinite(v).any():
            continue
        grid = np.full((n_layers, n_heads), np.nan)
        tips = [[f"L{li}.H{h}: no value" for h in range(n_heads)] for li in range(n_layers)]
        for i, (li, h) in enumerate(zip(L, H)):
            if li < 0 or h < 0:
                continue
            grid[li, h] = v[i]
            tips[li][h] = (f"L{li}.H{h} {lab} {fmt(v[i])}"
                           + (f"\nstability {fmt(cols['stability'][i])} [{fmt(cols['ci_low'][i])}, {fmt(cols['ci_high'][i])}], null {fmt(cols['null_mean'][i])}")
                           + (f"\nmatch {match[i]}" if match[i] else ""))
        lo, hi = data_range(v)
        if c == "stability" and lo >= 0 and hi <= 1:
            lo, hi = 0.0, 1.0
        figs.append(f'<figure>{heatmap(grid, tips, lab, lo, hi)}<figcaption>{esc(lab[:1].upper() + lab[1:])} per head (layer 0 at the bottom); hover for the CI and the null.</figcaption></figure>')
    o = np.lexsort((H, L))
    rows = [[int(L[i]), int(H[i]), cols["stability"][i], cols["ci_low"][i], cols["ci_high"][i], cols["null_mean"][i],
             cols["distinctness"][i], cols["importance"][i], match[i], pairs[i]] for i in o[:MAX_ROWS]]
    tcols = [("layer", "int"), ("head", "int"), ("stability", "num"), ("CI low", "num"), ("CI high", "num"), ("null", "num"),
             ("distinctness", "num"), ("importance", "num"), ("match", "text"), ("pairs", "text")]
    tbl = html_table(tcols, rows, shown_note=shown(len(rows), t.num_rows, "heads", "by layer, head"))
    return f'<h3>Heads</h3><div class="row">{"".join(figs)}<div class="tablebox">{tbl}</div></div>'


def layers_part(T: Tables) -> str:
    t = T.need("layers", ["layer", "stability"])
    o = np.argsort(ints(t, "layer"), kind="stable")
    L = ints(t, "layer")[o].astype(float)
    v = {c: num(t, c)[o] for c in ("stability", "ci_low", "ci_high", "null_mean")}
    lo, hi = data_range(*v.values(), [0.0])
    yd = (0.0, 1.0) if lo >= 0 and hi <= 1 else nice_domain(*padded(lo, hi))
    p = Plot(520, 320, (L.min() - 0.6, L.max() + 0.6), yd, label="layer stability vs null")
    col = PALETTE[0]
    for x, a, b in zip(L, v["ci_low"], v["ci_high"]):
        p.vbar(x, a, b, col)
    p.line(L, v["null_mean"], "#777", width=1.2, dash="4,3", title="null")
    p.points(L, v["null_mean"], "#777", r=3.5, shape="x", titles=[f"layer {int(a)} null {fmt(b)}" for a, b in zip(L, v["null_mean"])])
    p.points(L, v["stability"], col, r=3.5, titles=[f"layer {int(a)}: {fmt(b)} [{fmt(c)}, {fmt(d)}]" for a, b, c, d in zip(L, v["stability"], v["ci_low"], v["ci_high"])])
    p.legend("layer stability (CI)", col, "point")
    p.legend("null", "#777", "x")
    xt = L.tolist() if L.size <= 24 else L[:: max(1, L.size // 12)].tolist()
    p.axes("layer", "stability", xticks=xt, xtick_labels=[str(int(x)) for x in xt])
    s = v["stability"]
    gap = float(np.nanmax(s) - np.nanmin(s)) if np.isfinite(s).any() else math.nan
    rows = [[int(L[i]), s[i], v["ci_low"][i], v["ci_high"][i], v["null_mean"][i], s[i] - v["null_mean"][i]] for i in range(len(L))]
    tbl = html_table([("layer", "int"), ("stability", "num"), ("CI low", "num"), ("CI high", "num"), ("null", "num"), ("above null", "num")], rows[:MAX_ROWS])
    cap = f"Layer stability (mean over heads) with CIs against its null (×, dashed). Gap (max − min) = {fmt(gap)}."
    return "<h3>Layers</h3>" + figure(p.svg(), cap, tbl)


def residual_part(T: Tables) -> str:
    t = T.need("residual", ["layer", "cka"])
    L = ints(t, "layer").astype(float)
    hooks, kinds = strs(t, "hook"), strs(t, "kind")
    series = list(dict.fromkeys(zip(kinds, hooks)))
    kind_list = list(dict.fromkeys(kinds))
    hook_list = list(dict.fromkeys(hooks))
    cka, cl, ch = num(t, "cka"), num(t, "ci_low"), num(t, "ci_high")
    lo, hi = data_range(cka, cl, ch)
    yd = (0.0, 1.0) if lo >= 0 and hi <= 1 else nice_domain(*padded(lo, hi))
    p = Plot(520, 320, (L.min() - 0.4, L.max() + 0.4), yd, label="residual CKA per layer")
    rows = []
    for kd, hk in series:
        mask = np.array([(a == kd and b == hk) for a, b in zip(kinds, hooks)])
        o = np.argsort(L[mask], kind="stable")
        x, y, a, b = L[mask][o], cka[mask][o], cl[mask][o], ch[mask][o]
        c = PALETTE[kind_list.index(kd) % len(PALETTE)]
        dash = None if hook_list.index(hk) == 0 else "5,3"
        p.band(x, a, b, c, opacity=0.12)
        p.line(x, y, c, dash=dash, title=f"{kd} CKA at {hk}")
        p.points(x, y, c, r=2.6, titles=[f"layer {int(u)} {kd} CKA at {hk}: {fmt(w)} [{fmt(q)}, {fmt(z)}]" for u, w, q, z in zip(x, y, a, b)])
        p.legend(f"{kd} @ {hk}" if hk else kd, c, "line" if dash is None else "dash")
        # runs written before the column existed: the flag follows from the kind
        flag = np.array(strs(t, "interval_reliable"))[mask][o]
        trusted = [{"True": "yes", "False": "no (biased kind)"}.get(
            v, "yes" if kd == "debiased" else "no (biased kind)") for v in flag]
        rows += [[int(x[i]), hk, kd, y[i], a[i], b[i], trusted[i]] for i in range(len(x))]
    xt = sorted(set(L.tolist()))
    xt = xt if len(xt) <= 24 else xt[:: max(1, len(xt) // 12)]
    p.axes("layer", "CKA across seeds", xticks=xt, xtick_labels=[str(int(x)) for x in xt])
    tbl = html_table([("layer", "int"), ("hook", "text"), ("kind", "text"), ("CKA", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("interval trusted", "text")], rows[:MAX_ROWS],
                     shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    return "<h3>Residual stream</h3>" + figure(p.svg(), "Residual-stream CKA between seeds per layer, with CI bands (colour: CKA kind; dashed: second hook). "
                  "Only the debiased kind's intervals cover the population CKA; linear and RBF CKA are biased in "
                  "finite samples (interval trusted: no).", tbl)


# ----- (7) variance components ------------------------------------------------------------------
def variance_part(T: Tables) -> str:
    t = T.need("variance_components", ["edge", "source", "share"])
    e, srcs = ints(t, "edge"), strs(t, "source")
    share, var = num(t, "share"), num(t, "variance")
    names = strs(t, "name")
    sources = list(dict.fromkeys(srcs))
    si = {s: j for j, s in enumerate(sources)}
    edge_ids, first, inv = np.unique(e, return_index=True, return_inverse=True)
    sidx = np.fromiter((si[x] for x in srcs), dtype=np.int64, count=len(srcs))
    S = np.zeros((edge_ids.size, len(sources)))
    np.add.at(S, (inv, sidx), np.where(np.isfinite(share), share, 0.0))
    V = np.bincount(inv, weights=np.where(np.isfinite(var), var, 0.0), minlength=edge_ids.size)
    nm = [names[i] or str(int(e[i])) for i in first]
    look = edge_lookup(T, (order_methods(methods_in(T.get("edge_stats"))) or [None])[0])
    if look and any(int(x) in look for x in edge_ids):
        key = np.array([abs(look.get(int(x), (0.0,))[0]) for x in edge_ids])
        key = np.where(np.isfinite(key), key, 0)
        by = "largest |estimate|"
    else:
        key, by = V, "largest total variance"
    top = np.argsort(-key, kind="stable")[:TOP_FOREST]
    n = top.size
    row_h = 18
    height = 70 + n * row_h
    xmax = max(1.0, float(np.nanmax(S[top].sum(1))) if n else 1.0)
    p = Plot(640, height, (0, xmax), (-0.6, n - 0.4), margin=(38, 16, 42, 200), label="variance shares of top edges")
    for i, r in enumerate(top):
        y = n - 1 - i
        x0 = 0.0
        for j, s in enumerate(sources):
            w = S[r, j]
            if w <= 0:
                continue
            a, b = p.x(x0), p.x(x0 + w)
            yy = p.y(y + 0.36)
            c = PALETTE[j % len(PALETTE)]
            p.raw(f'<rect x="{a:.1f}" y="{yy:.1f}" width="{max(b - a, 0.3):.1f}" height="{p.y(y - 0.36) - yy:.1f}" fill="{c}"><title>{esc(nm[r])}: {esc(s)} {esc(fmt(w))}</title></rect>')
            x0 += w
    lx = p.left
    for j, s in enumerate(sources):  # legend on top, in one line
        c = PALETTE[j % len(PALETTE)]
        p.raw(f'<rect x="{lx:.1f}" y="8" width="10" height="10" fill="{c}"/><text x="{lx + 14:.1f}" y="17" font-size="{FONT - 1}">{esc(s)}</text>')
        lx += 24 + 6.2 * len(s)
    short = [nm[r] if len(nm[r]) <= 30 else nm[r][:29] + "…" for r in top]
    p.axes("share of variance", "", yticks=[n - 1 - i for i in range(n)], ytick_labels=short, grid=False)
    cols = [("edge", "text"), ("total variance", "num")] + [(s, "num") for s in sources]
    rows = [[nm[r], V[r], *S[r].tolist()] for r in top]
    tbl = html_table(cols, rows, shown_note=shown(n, edge_ids.size, "edges", by))
    cap = f"Share of each edge's score variance by source (crossed random-effects design), for the {n} edges with the {by}."
    return "<h3>Variance components</h3>" + figure(p.svg(), cap, tbl) + _pooled_shares_table(T)


def _pooled_shares_table(T: Tables) -> str:
    """The pooled variance shares with their intervals and reliability flags ('' for older runs)."""
    t = T.get("variance_shares")
    if t is None or "interval_reliable" not in t.column_names:
        return ""
    share, lo, hi = num(t, "share"), num(t, "ci_low"), num(t, "ci_high")
    ok = num(t, "interval_reliable")
    rows = [[s, share[i], lo[i], hi[i], bool(ok[i]), how] for i, (s, how) in enumerate(zip(strs(t, "source"), strs(t, "interval")))]
    cols = [("source", "text"), ("share", "num"), ("CI low", "num"), ("CI high", "num"), ("interval reliable", "bool"), ("interval", "text")]
    n_edges = int(num(t, "n_edges")[0]) if t.num_rows else 0
    cap = (f"Variance shares pooled over the top {n_edges} edges. Estimand: {strs(t, 'estimand')[0] if t.num_rows else ''}. "
           "Rows with the examples: bootstrap over prompts (robust to heavy-tailed effects); rows without them rest on the few "
           "levels of their factors (normal-theory pivot) and are flagged not reliable.")
    return f"<p>{esc(cap)}</p>" + html_table(cols, rows[:MAX_ROWS])


def variance_summary_part(T: Tables) -> str:
    t = T.need("variance_summary", ["factor", "jaccard_to_reference"])
    f = strs(t, "factor")
    j, lo, hi = num(t, "jaccard_to_reference"), num(t, "ci_low"), num(t, "ci_high")
    k = num(t, "k")
    n = len(f)
    new = "bar" in t.column_names  # the bar is recorded in the table and verdicts read the interval
    # runs written before that carry meets_0_8 (the point estimate against 0.8)
    bar = (float(num(t, "bar")[0]) if n else BAR) if new else BAR
    meets = num(t, "meets_bar" if new else "meets_0_8")
    p = Plot(560, 70 + 22 * n, (0, 1), (-0.6, n - 0.4), margin=(14, 16, 42, 150), label="Jaccard to the reference circuit by factor")
    p.vline(bar, "#b00", dash="6,4")
    for i in range(n):
        y = n - 1 - i
        p.hbar(y, lo[i], hi[i], PALETTE[0])
        p.points([j[i]], [y], PALETTE[0], r=3.5, titles=[f"{f[i]}: {fmt(j[i])} [{fmt(lo[i])}, {fmt(hi[i])}] at k = {fmt(k[i])}"])
    p.axes("Jaccard to the reference circuit", "", yticks=[n - 1 - i for i in range(n)], ytick_labels=[s if len(s) <= 22 else s[:21] + "…" for s in f], xticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    cols = [("factor", "text"), ("Jaccard", "num"), ("CI low", "num"), ("CI high", "num"), (f"meets {bar:g}", "bool"), ("k", "int")]
    rows = [[f[i], j[i], lo[i], hi[i], None if math.isnan(meets[i]) else bool(meets[i]), k[i]] for i in range(n)]
    if new:
        cols += [("verdict", "text"), ("interval covers", "text")]
        rows = [r + [v, e] for r, v, e in zip(rows, strs(t, "verdict"), strs(t, "estimand"))]
    tbl = html_table(cols, rows[:MAX_ROWS])
    cap = ((f"How much each factor moves the circuit: Jaccard of the circuit under the factor to the reference circuit, with its interval "
           f"(each covers the estimand in its row: paired levels, the expected Jaccard over datasets of N prompts with the level fixed; "
           f"fresh draws, the expected Jaccard between independent datasets); dashed: the {bar:g} bar (from the table). ")
           + ("Verdict: met when the interval lies above the bar, not met below it, inconclusive across it." if new else
              "Older run: meets compares the point estimate with the bar."))
    return "<h3>Per-factor circuit stability</h3>" + figure(p.svg(), cap, tbl)


# ----- summary ----------------------------------------------------------------------------------
def summary_section(T: Tables) -> str:
    t = T.need("summary", ["item", "value"])
    items, verdicts = strs(t, "item"), strs(t, "verdict")
    v, lo, hi = num(t, "value"), num(t, "ci_low"), num(t, "ci_high")
    body = []
    for i in range(t.num_rows):
        vd = verdicts[i]
        cls = "pass" if vd.lower() in ("pass", "passed", "holds", "ok", "stable", "yes", "true", "met") else (
            "fail" if vd.lower() in ("fail", "failed", "violated", "unstable", "no", "false", "not met") else "")
        body.append(f'<tr><td>{esc(items[i])}</td><td class="n">{esc(fmt(v[i]))}</td><td class="n">{esc(fmt(lo[i]))}</td>'
                    f'<td class="n">{esc(fmt(hi[i]))}</td><td class="{cls}">{esc(vd)}</td></tr>')
    return ('<table class="summary"><thead><tr><th>item</th><th class="n">value</th><th class="n">CI low</th><th class="n">CI high</th>'
            f'<th>verdict</th></tr></thead><tbody>{"".join(body)}</tbody></table>')


# ----- calibration study --------------------------------------------------------------------------
CAL_COLS = [("interval", "text"), ("N", "int"), ("coverage", "num"), ("± MC", "num"), ("worst unit", "num"),
            ("reliable: coverage", "num"), ("reliable share", "num"), ("mean width", "num")]
CAL_SRC = ("coverage", "coverage_mc_se", "worst_unit_coverage", "coverage_reliable", "share_reliable", "mean_width")


CAL_FAMILY_STYLE = {"edge": ("line", None), "stability": ("dash", "5,3"), "faithfulness": ("dot", "1.5,2.5")}


def calibration_part(T: Tables) -> str:
    """Coverage vs N per interval kind (from `circuitstat study calibration`), with the nominal level."""
    t = T.need("coverage", ["kind", "n", "coverage", "coverage_mc_se"])
    kinds = list(dict.fromkeys(strs(t, "kind")))
    # colour by method within a family, line style by family: 12 kinds stay distinguishable with 8 colours
    col = {k: c for fam in dict.fromkeys(k.split("/")[0] for k in kinds)
           for k, c in colours([k for k in kinds if k.split("/")[0] == fam]).items()}
    style = {k: CAL_FAMILY_STYLE.get(k.split("/")[0], ("line", None)) for k in kinds}
    ks, ns = np.array(strs(t, "kind")), num(t, "n")
    nominal = float(num(t, "confidence_level")[0]) if "confidence_level" in t.column_names else 0.95
    xd, xlog = x_domain_k(ns)
    lo_y = max(0.0, min(0.5, float(np.nanmin(num(t, "coverage"))) - 0.05))
    p = Plot(600, 360, xd, (lo_y, 1.0), xlog=xlog, label="coverage vs N")
    rows = []
    for kind in kinds:
        s = sub(t, ks == kind)
        o = np.argsort(num(s, "n"), kind="stable")
        n, c, se = num(s, "n")[o], num(s, "coverage")[o], num(s, "coverage_mc_se")[o]
        p.band(n, c - 2 * se, c + 2 * se, col[kind])
        p.line(n, c, col[kind], title=kind, dash=style[kind][1])
        p.points(n, c, col[kind], r=2.8, titles=[f"{kind} N={fmt(a)}: coverage {fmt(b)} ± {fmt(2 * e)}"
                                                for a, b, e in zip(n, c, se)])
        p.legend(kind, col[kind], style[kind][0])
        rows += [[kind, a, *(num(s, k)[o][i] for k in CAL_SRC)] for i, a in enumerate(n)]
    p.hline(nominal, "#b00", dash="6,4")
    p.legend(f"nominal {nominal:g}", "#b00", "dash")
    p.axes("dataset size N (prompts)" + (", log scale" if xlog else ""), "empirical coverage", xticks=k_ticks(ns, p))
    tbl = html_table(CAL_COLS, rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "rows", "first rows"))
    by_estimand: dict[str, list[str]] = {}
    for kind, est in dict(zip(strs(t, "kind"), strs(t, "estimand"))).items():
        by_estimand.setdefault(est, []).append(kind)
    estimands = "; ".join(f"{', '.join(kinds) if len(by_estimand) > 1 else 'every interval'}: {est}"
                          for est, kinds in by_estimand.items())
    cap = (f"Empirical coverage of each interval over datasets of N prompts drawn from the population (band: ±2 Monte "
           f"Carlo SE, each dataset one unit: the edges of one dataset are not independent); dashed red: the nominal "
           f"{nominal:g}; solid lines: per-edge intervals, dashed: circuit stability, dotted: faithfulness. "
           f"Estimands — {estimands}.")
    return figure(p.svg(), cap, tbl)


# ----- token contributions and attention sinks (``circuitstat tokens``) ---------------------------------
TOKEN_TABLES = ("token_weights", "token_importance", "token_importance_diffs", "sink_heads", "sink_fit")
SEED_TABLES = ("token_stability", "sink_stability", "sink_matching")
HEATMAP_PROMPTS = 3  # prompts drawn as contribution-vs-attention heatmaps (the rest are in token_weights)
DIVERGING = ("#2166ac", "#67a9cf", "#d1e5f0", "#f7f7f7", "#fddbc7", "#ef8a62", "#b2182b")
_MODEL_DIR = re.compile(r"^model-(\d+)$")


def token_model_dirs(run_dir: Path) -> list[Path]:
    """Return the model-<i>/ parts of a cross-seed tokens run that hold a tokens table, in model order."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _MODEL_DIR.match(p.name))]
    return [p for _, p in sorted(found) if any((p / f"{t}.parquet").exists() for t in TOKEN_TABLES)]


def has_tokens(T: Tables) -> bool:
    """Return whether the run holds tables of ``circuitstat tokens`` (at its top or under model-<i>/)."""
    return any(T.path(t).exists() for t in TOKEN_TABLES + SEED_TABLES) or bool(token_model_dirs(T.dir))


def tokens_section(T: Tables, sources: Sequence[str] = (), part: Callable[[Callable[[], str]], str] = lambda f: f()) -> str:
    """The tokens section: per model, sinks (scatter with the fit), drops, differences, heatmaps; then across seeds.

    `sources` names the models of a cross-seed run (model-<i> is sources[i]); `part` turns a
    sub-part's Missing into a note (reports.html._part)."""
    out = []
    if any(T.path(t).exists() for t in TOKEN_TABLES):
        out.append(_token_model_parts(T, part, heatmaps=True))
    for j, d in enumerate(token_model_dirs(T.dir)):
        i = int(_MODEL_DIR.match(d.name).group(1))
        src = f": {sources[i]}" if i < len(sources) else ""
        # the refits share the task's prompts: one model's heatmaps show them (the file stays small)
        out.append(f"<h3>{esc(d.name + src)}</h3>" + _token_model_parts(Tables(d), part, heatmaps=j == 0))
    if any(T.path(t).exists() for t in SEED_TABLES):
        out.append("<h3>Across seeds</h3>" + part(lambda: sink_stability_part(T)) + part(lambda: sink_matching_part(T))
                   + part(lambda: token_stability_part(T)))
    if not out:
        raise Missing("No tables of `circuitstat tokens` are in this run directory, so this section is omitted.")
    return "".join(out)


def _token_model_parts(T: Tables, part: Callable[[Callable[[], str]], str], heatmaps: bool) -> str:
    parts = [lambda: sinks_part(T), lambda: token_drops_part(T), lambda: token_diffs_part(T)]
    return "".join(part(f) for f in parts + ([lambda: token_heatmaps_part(T)] if heatmaps else []))


def _fit_rows(T: Tables) -> dict[str, dict[str, Any]]:
    """Return sink_fit's rows by term ({} without the table)."""
    t = T.get("sink_fit")
    if t is None or "term" not in t.column_names:
        return {}
    return {r["term"]: r for r in t.to_pylist()}


def sinks_part(T: Tables) -> str:
    """Sink rate vs output norm per head, with CIs, the fitted quadratic and its curvature interval."""
    t = T.need("sink_heads", ["layer", "head", "sink_rate", "output_norm"])
    L, H, nodes = ints(t, "layer"), ints(t, "head"), strs(t, "node")
    nodes = [n or f"a{a}.h{b}" for n, a, b in zip(nodes, L, H)]
    c = {k: num(t, k) for k in ("sink_rate", "ci_low", "ci_high", "output_norm", "norm_ci_low", "norm_ci_high",
                                "confidence_gap", "threshold", "n", "interval_reliable")}
    x, y = c["sink_rate"], c["output_norm"]
    if not finite(x, y).any():
        raise Missing("sink_heads.parquet has no head with a finite sink rate and output norm, so the scatter is omitted.")
    fit = _fit_rows(T)
    b = [fit.get(term, {}).get("estimate", math.nan) for term in ("intercept", "slope", "curvature")]
    xs = np.linspace(*data_range(x), 60)
    curve = b[0] + b[1] * xs + b[2] * xs ** 2 if all(v is not None and math.isfinite(v) for v in b) else None
    lo, hi = data_range(x, c["ci_low"], c["ci_high"], [0.0])
    xd = (lo - 0.03 * (hi - lo), nice_domain(lo, hi)[1])  # rates are shares: no negative ticks
    yd = nice_domain(*padded(*data_range(y, c["norm_ci_low"], c["norm_ci_high"], [] if curve is None else curve), 0.06))
    p = Plot(520, 360, xd, yd, label="sink rate vs output norm per head")
    if curve is not None:
        p.line(xs, curve, "#555", width=1.4, dash="6,3", title="least-squares quadratic")
        p.legend("quadratic fit", "#555", "dash")
    layers = sorted(set(L.tolist()))
    for li in layers:
        m = L == li
        col = PALETTE[layers.index(li) % len(PALETTE)]
        for i in np.flatnonzero(m):
            p.hbar(y[i], c["ci_low"][i], c["ci_high"][i], col, width=1.0)
            p.vbar(x[i], c["norm_ci_low"][i], c["norm_ci_high"][i], col, width=1.0)
        p.points(x[m], y[m], col, r=3.5, titles=[f"{nodes[i]}: sink rate {fmt(x[i])} [{fmt(c['ci_low'][i])}, "
                                                 f"{fmt(c['ci_high'][i])}], output norm {fmt(y[i])} "
                                                 f"[{fmt(c['norm_ci_low'][i])}, {fmt(c['norm_ci_high'][i])}]"
                                                 for i in np.flatnonzero(m)])
        p.legend(f"layer {li}", col, "point")
    p.axes("sink rate (share of positions attending to the sink above the threshold)", "mean head output norm")
    o = np.lexsort((H, L))
    rows = [[nodes[i], x[i], c["ci_low"][i], c["ci_high"][i], y[i], c["norm_ci_low"][i], c["norm_ci_high"][i],
             c["confidence_gap"][i], None if math.isnan(c["interval_reliable"][i]) else bool(c["interval_reliable"][i])]
            for i in o[:MAX_ROWS]]
    tbl = html_table([("head", "text"), ("sink rate", "num"), ("CI low", "num"), ("CI high", "num"), ("output norm", "num"),
                      ("norm CI low", "num"), ("norm CI high", "num"), ("confidence gap", "num"),
                      ("interval reliable", "bool")], rows, shown_note=shown(len(rows), t.num_rows, "heads", "by layer, head"))
    thr, n = c["threshold"], c["n"]
    cap = (f"Each head's sink rate (threshold {fmt(thr[0]) if thr.size else '—'} on the attention to the sink token) "
           f"against its mean output norm, means over {int(n[0]) if n.size and n[0] >= 0 else '—'} prompts with their intervals "
           "(both cover the head's mean over the prompt distribution).")
    cap += " " + _fit_caption(fit)
    return "<h4>Attention sinks: sink rate vs output norm</h4>" + figure(p.svg(), cap, tbl)


def _fit_caption(fit: dict[str, dict[str, Any]]) -> str:
    """The fitted relation in words: curvature and Spearman with their intervals, verdicts and rules."""
    if not fit:
        return "sink_fit.parquet is missing, so no fit is drawn."
    parts = []
    for term, what in (("curvature", "curvature b2 of the quadratic norm = b0 + b1 s + b2 s²"), ("spearman", "Spearman ρ")):
        r = fit.get(term)
        if r is None:
            continue
        parts.append(f"{what} = {fmt(r.get('estimate'))} [{fmt(r.get('ci_low'))}, {fmt(r.get('ci_high'))}] "
                     f"({r.get('interval') or 'interval'}): {r.get('verdict') or 'no verdict'}")
    first = next(iter(fit.values()))
    est = (fit.get("curvature") or first).get("estimand") or ""
    rule = first.get("multiplicity") or ""
    return "Dashed: the least-squares quadratic across heads; " + "; ".join(parts) + (
        f". The curvature interval covers {est}" if est else "") + (f". Verdicts: {rule}." if rule else ".")


def token_drops_part(T: Tables) -> str:
    """Mean metric drop per measure and k with intervals (random = the null)."""
    t = T.need("token_importance", ["measure", "k", "mean_drop", "ci_low", "ci_high"])
    ms, k = strs(t, "measure"), num(t, "k")
    v, lo, hi = num(t, "mean_drop"), num(t, "ci_low"), num(t, "ci_high")
    ok = num(t, "interval_reliable")
    measures = list(dict.fromkeys(ms))
    col = colours(measures)
    ks = np.unique(k[np.isfinite(k)])
    pos = {kk: i for i, kk in enumerate(ks.tolist())}
    w = min(0.7, 0.16 * len(measures))
    off = {m: (j - (len(measures) - 1) / 2) * (w / max(len(measures) - 1, 1)) for j, m in enumerate(measures)}
    yd = nice_domain(*padded(*data_range(v, lo, hi, [0.0]), 0.04))
    p = Plot(560, 340, (-0.6, len(ks) - 0.4), yd, label="mean metric drop per measure and k")
    p.hline(0.0, "#999", dash=None)
    for m in measures:
        idx = [i for i, s in enumerate(ms) if s == m and np.isfinite(k[i])]
        xs = np.array([pos[k[i]] + off[m] for i in idx])
        for xx, i in zip(xs, idx):
            p.vbar(xx, lo[i], hi[i], col[m])
        p.points(xs, v[idx], col[m], r=3.4, titles=[f"{m} k={fmt(k[i])}: mean drop {fmt(v[i])} [{fmt(lo[i])}, {fmt(hi[i])}]"
                                                   for i in idx])
        p.legend(m + (" (null)" if m == "random" else ""), col[m], "point")
    p.axes("k (top tokens ablated)", "mean metric drop", xticks=list(range(len(ks))),
           xtick_labels=[str(int(kk)) for kk in ks])
    rows = [[ms[i], k[i], v[i], lo[i], hi[i], num(t, "n")[i], None if math.isnan(ok[i]) else bool(ok[i])]
            for i in range(t.num_rows)]
    tbl = html_table([("measure", "text"), ("k", "int"), ("mean drop", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("n", "int"), ("interval reliable", "bool")], rows[:MAX_ROWS])
    est = strs(t, "estimand")[0] if t.num_rows else ""
    how = strs(t, "interval")[0] if t.num_rows else ""
    cap = (f"Metric drop when each measure's top-k tokens are ablated (random: the null), mean over prompts with its "
           f"interval ({how or 'interval over prompts'}; covers {est or 'the mean drop over the prompt distribution'}).")
    return "<h4>Token-importance faithfulness: mean drop per measure and k</h4>" + figure(p.svg(), cap, tbl)


def token_diffs_part(T: Tables) -> str:
    """The paired differences of drops between measures with their Holm verdicts."""
    t = T.need("token_importance_diffs", ["measure_a", "measure_b", "k", "difference", "verdict"])
    a, b, verdict = strs(t, "measure_a"), strs(t, "measure_b"), strs(t, "verdict")
    cols = {c: num(t, c) for c in ("k", "difference", "ci_low", "ci_high", "pvalue", "pvalue_holm", "interval_reliable")}
    rows = [[a[i], b[i], cols["k"][i], cols["difference"][i], cols["ci_low"][i], cols["ci_high"][i], cols["pvalue"][i],
             cols["pvalue_holm"][i], verdict[i],
             None if math.isnan(cols["interval_reliable"][i]) else bool(cols["interval_reliable"][i])]
            for i in range(t.num_rows)]
    tbl = html_table([("measure a", "text"), ("measure b", "text"), ("k", "int"), ("drop a − b", "num"), ("CI low", "num"),
                      ("CI high", "num"), ("p", "p"), ("p (Holm)", "p"), ("verdict", "text"), ("interval reliable", "bool")],
                     rows[:MAX_ROWS], shown_note=shown(min(len(rows), MAX_ROWS), len(rows), "differences", "first rows"))
    n_sig = sum(v != "inconclusive" for v in verdict)
    rule = strs(t, "multiplicity")[0] if t.num_rows else ""
    est = strs(t, "estimand")[0] if t.num_rows else ""
    cap = (f"Paired differences of the metric drop between measures (same prompts), {n_sig} of {t.num_rows} decided. "
           f"Verdicts: {rule or 'Holm over the family'}. Intervals cover {est or 'the mean paired difference'}; a "
           "difference flagged not reliable rests on a few prompts.")
    return f"<h4>Which measure finds the tokens that matter?</h4><p>{esc(cap)}</p>" + f'<div class="tablebox">{tbl}</div>'


def token_heatmaps_part(T: Tables) -> str:
    """Per-token weights of every measure for the first prompts (rows: measures; columns: positions)."""
    t = T.need("token_weights", ["prompt", "position", "token"])
    measures = [m for m in ("attention", "value_norm", "contribution", "grad_input") if m in t.column_names]
    if not measures:
        raise Missing("token_weights.parquet has no measure columns, so the heatmaps are omitted.")
    prompt, position, token = ints(t, "prompt"), ints(t, "position"), ints(t, "token")
    readout = num(t, "is_readout")
    shown_prompts = sorted(set(prompt.tolist()))[:HEATMAP_PROMPTS]
    figs = []
    for n in shown_prompts:
        m = prompt == n
        o = np.argsort(position[m], kind="stable")
        pos, tok, ro = position[m][o], token[m][o], readout[m][o]
        vals = np.stack([num(t, c)[m][o] for c in measures])
        figs.append(f"<figure>{_token_heatmap(vals, measures, pos, tok, ro, n)}<figcaption>Prompt {n}: each measure's "
                    "weight per token at the read-out position (outlined), scaled by the row's largest |weight| "
                    "(red positive, blue negative); hover for values.</figcaption></figure>")
    n_prompts = len(set(prompt.tolist()))
    cap = (f"Contribution vs attention on {len(shown_prompts)} of {n_prompts} prompts (every prompt's weights are in "
           "token_weights.parquet).")
    return f'<h4>Token weights per measure</h4><p>{esc(cap)}</p><div class="row">{"".join(figs)}</div>'


def _token_heatmap(vals: np.ndarray, measures: Sequence[str], pos: np.ndarray, tok: np.ndarray, readout: np.ndarray,
                   prompt: int) -> str:
    """One prompt's [measures x positions] heatmap, each row scaled by its largest |weight|."""
    n_rows, n_cols = vals.shape
    c = max(6.0, min(22.0, 640 / max(n_cols, 1)))
    left, top, bottom = 92, 10, 30
    width, height = left + n_cols * c + 12, top + n_rows * c + bottom
    parts = [svg_open(width, height, f"token weights of prompt {prompt}")]
    for r, name in enumerate(measures):
        scale = np.nanmax(np.abs(vals[r])) if np.isfinite(vals[r]).any() else math.nan
        y = top + r * c
        parts.append(f'<text x="{left - 5}" y="{y + c / 2 + 3.5:.1f}" font-size="{FONT - 1}" text-anchor="end">{esc(name)}</text>')
        for j in range(n_cols):
            v = vals[r, j]
            fill = "#eeeeee" if not (math.isfinite(v) and scale > 0) else ramp(DIVERGING, 0.5 + 0.5 * v / scale)
            x = left + j * c
            edge = ' stroke="#000" stroke-width="1.2"' if readout[j] == 1 else ' stroke="#fff" stroke-width="0.5"'
            tip = f"{name}, position {pos[j]} (token {tok[j]}): {fmt(v)}" + (" — read-out" if readout[j] == 1 else "")
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{c:.1f}" height="{c:.1f}" fill="{fill}"{edge}>'
                         f"<title>{esc(tip)}</title></rect>")
    step = max(1, int(math.ceil(24 / c)))
    for j in range(0, n_cols, step):
        parts.append(f'<text x="{left + j * c + c / 2:.1f}" y="{top + n_rows * c + 12:.1f}" font-size="{FONT - 2}" '
                     f'text-anchor="middle">{pos[j]}</text>')
    parts.append(f'<text x="{left + n_cols * c / 2:.1f}" y="{height - 4:.1f}" font-size="{FONT - 1}" '
                 'text-anchor="middle">position</text></svg>')
    return "".join(parts)


def sink_stability_part(T: Tables) -> str:
    """Sink heads and the sink-norm relation across seeds (rank-matched per layer)."""
    t = T.need("sink_stability", ["layer", "item", "value", "ci_low", "ci_high"])
    L, items = ints(t, "layer"), strs(t, "item")
    cols = {c: num(t, c) for c in ("value", "ci_low", "ci_high", "sd", "min", "max", "n_refits")}
    rows = [["model" if L[i] < 0 else str(L[i]), items[i], *(cols[c][i] for c in cols)] for i in range(t.num_rows)]
    tbl = html_table([("layer", "text"), ("item", "text"), ("mean over seeds", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("SD", "num"), ("min", "num"), ("max", "num"), ("seeds", "int")], rows[:MAX_ROWS])
    est = strs(t, "estimand")[0] if t.num_rows else ""
    cap = (f"Are the sink heads the same across seeds? Sink rates matched by rank within each layer, the number of sink "
           f"heads, and the sink-norm relation per seed; intervals cover {est or 'the mean over training seeds'}.")
    return f"<h4>Attention sinks across seeds</h4><p>{esc(cap)}</p>" + f'<div class="tablebox">{tbl}</div>'


def sink_matching_part(T: Tables) -> str:
    """Sink-head agreement across seeds with heads matched by attention pattern, against a random matching."""
    t = T.need("sink_matching", ["layer", "item", "value", "ci_low", "ci_high", "null", "excess", "verdict"])
    L, items, verdicts = ints(t, "layer"), strs(t, "item"), strs(t, "verdict")
    cols = {c: num(t, c) for c in ("value", "ci_low", "ci_high", "null", "excess", "excess_ci_low", "excess_ci_high",
                                   "n_pairs", "n_pairs_undefined")}
    rows = [["all" if L[i] < 0 else str(L[i]), items[i], *(cols[c][i] for c in list(cols)[:7]), verdicts[i],
             cols["n_pairs"][i], cols["n_pairs_undefined"][i]] for i in range(t.num_rows)]
    tbl = html_table([("layer", "text"), ("item", "text"), ("mean over seed pairs", "num"), ("CI low", "num"),
                      ("CI high", "num"), ("random matching", "num"), ("excess", "num"), ("excess CI low", "num"),
                      ("excess CI high", "num"), ("verdict", "text"), ("pairs", "int"), ("pairs undefined", "int")],
                     rows[:MAX_ROWS])
    first = lambda c: strs(t, c)[0] if t.num_rows else ""  # noqa: E731
    bar = num(t, "sink_bar")
    cap = (f"Are the sink heads the same heads across seeds? Heads are matched within each layer by attention pattern "
           f"({first('matching')}); a sink head has sink rate >= {fmt(bar[0]) if bar.size else '—'}. Each item is "
           "compared with its exact expectation under a random one-to-one matching; excess > 0 means more alike than "
           "chance (for the rate difference: smaller than chance). Pairs where no seed has a sink head are undefined and "
           f"counted, not dropped. Intervals: {first('estimand') or 'the mean over training seeds'}.")
    return f"<h4>Sink heads across seeds, matched by attention pattern</h4><p>{esc(cap)}</p>" + \
        f'<div class="tablebox">{tbl}</div>'


def token_stability_part(T: Tables) -> str:
    """Top-k token agreement between seeds per measure and k, against chance."""
    t = T.need("token_stability", ["measure", "k", "jaccard", "chance"])
    ms, k = strs(t, "measure"), num(t, "k")
    v = {c: num(t, c) for c in ("jaccard", "ci_low", "ci_high", "chance", "excess", "excess_ci_low", "excess_ci_high")}
    measures = list(dict.fromkeys(ms))
    col = colours(measures)
    xd, xlog = x_domain_k(k)
    p = Plot(520, 320, xd, (0.0, 1.0), xlog=xlog, label="top-k token Jaccard between seeds")
    for m in measures:
        idx = np.array([i for i, s in enumerate(ms) if s == m], dtype=int)
        idx = idx[np.argsort(k[idx], kind="stable")]
        p.band(k[idx], v["ci_low"][idx], v["ci_high"][idx], col[m])
        p.line(k[idx], v["jaccard"][idx], col[m], title=m)
        p.line(k[idx], v["chance"][idx], col[m], width=1.0, dash="1.5,2.5", title=f"{m}: chance")
        p.points(k[idx], v["jaccard"][idx], col[m], r=2.6, titles=[f"{m} k={fmt(k[i])}: {fmt(v['jaccard'][i])} "
                                                                   f"[{fmt(v['ci_low'][i])}, {fmt(v['ci_high'][i])}], "
                                                                   f"chance {fmt(v['chance'][i])}" for i in idx])
        p.legend(m, col[m])
    p.legend("chance", "#555", "dot")
    p.axes("k (top tokens)", "Jaccard between seeds", xticks=k_ticks(k, p), yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
    rows = [[ms[i], k[i], *(v[c][i] for c in v)] for i in range(t.num_rows)]
    tbl = html_table([("measure", "text"), ("k", "int"), ("Jaccard", "num"), ("CI low", "num"), ("CI high", "num"),
                      ("chance", "num"), ("excess", "num"), ("excess CI low", "num"), ("excess CI high", "num")],
                     rows[:MAX_ROWS])
    est = strs(t, "estimand")[0] if t.num_rows else ""
    cap = (f"Do the seeds pick the same top-k tokens? Mean top-k token Jaccard between seeds per measure with its "
           f"interval (covers {est or 'the expected Jaccard between two seeds'}); dotted: chance.")
    return "<h4>Important tokens across seeds</h4>" + figure(p.svg(), cap, tbl)
