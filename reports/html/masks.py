"""The edge-mask part of the report: a mask-learned method's (edge pruning's) learned mask, edge by edge.

Such a method has no per-example scores, so it has no per-edge interval, p- or q-value; the part says so in
the words of the run's method_notes table (the same reason the claims check gives) and shows, per edge, the
learned log alpha, its gate and how often the refits' masks keep the edge (edge_masks).
"""

from __future__ import annotations

import numpy as np

from circuitstat.reports.html.common import (TOP_FOREST, Tables, html_table, methods_in, note, num, order_methods,
                                             shown, strs, sub)
from circuitstat.reports.html.svg import esc

__all__ = ["masks_part"]


def _reason(T: Tables, method: str, table: str) -> str:
    """The method_notes reason ``table`` has no rows for ``method`` ('' without one)."""
    notes = T.get("method_notes")
    if notes is None:
        return ""
    return "; ".join(r["reason"] for r in notes.to_pylist() if r["method"] == method and r["table"] == table)


def masks_part(T: Tables, methods: list[str]) -> str:
    """Return, per mask-learned method, why it has no per-edge intervals and its top edges by learned log alpha."""
    t = T.need("edge_masks", ["method", "name", "log_alpha", "gate", "in_mask", "refit_frequency", "n_refits"])
    out = []
    for m in order_methods(methods_in(t)):
        r = sub(t, np.array(strs(t, "method")) == m)
        la = num(r, "log_alpha")
        order = np.argsort(-la, kind="stable")[:TOP_FOREST]
        names, gate, freq = strs(r, "name"), num(r, "gate"), num(r, "refit_frequency")
        kept = [bool(v) for v in r.column("in_mask").to_pylist()]
        n_refits = int(num(r, "n_refits")[0]) if r.num_rows else 0
        rows = [[names[i], la[i], gate[i], kept[i], freq[i]] for i in order]
        cols = [("edge", "text"), ("log alpha", "num"), ("gate", "num"), ("in its mask", "bool"),
                (f"kept by refits (of {n_refits})", "num")]
        why = _reason(T, m, "edge_stats") or "it has no per-example scores"
        ran = strs(r, "label")[0] if "label" in r.column_names and r.num_rows else m
        out.append(f"<h3>{esc(m)}: learned edge mask ({esc(ran)})</h3>"
                   + note(f"No per-edge interval, p- or q-value for {m}: {why}. Its circuits are the top-k edges by "
                          f"log alpha; their stability over {n_refits} refits (bootstrap resamples of the prompts, a "
                          "fresh seed each) and their selection-aware faithfulness are in the sections below.")
                   + html_table(cols, rows, shown_note=shown(len(rows), r.num_rows, "edges", "largest log alpha first")))
    return "".join(out)
