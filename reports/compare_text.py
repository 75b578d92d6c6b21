"""The terminal text of a run comparison (circuitstat.reports.compare.RunComparison.summary)."""

from __future__ import annotations

import math
from typing import Any

from circuitstat.core.interval_words import interval_text
from circuitstat.core.schema_core import DATA_JACCARD, HALF_JACCARD

RunComparison = Any  # circuitstat.reports.compare.RunComparison (not imported: it imports this module)

__all__ = ["summary_text", "biggest", "edge_rows_text", "all_equal_text", "stability_lead", "STABILITY_ESTIMANDS"]

#: what each stability column a comparison can lead with estimates (its heading quotes it whole)
STABILITY_ESTIMANDS = {"jaccard_half": HALF_JACCARD, "jaccard_data": DATA_JACCARD}


def stability_lead(comp: RunComparison) -> str:
    """The stability column a comparison's rows were compared on (``jaccard_half``, or ``jaccard_data`` when a run
    lacks J_{N/2}): the first name of its stability estimand."""
    return comp.estimands["stability"].split(":", 1)[0]


def _ci(row: dict, est: str, lo: str, hi: str, side: str) -> str:
    if not row[f"in_{side}"]:
        return "(not in run)"
    return interval_text(_f(row[f"{est}_{side}"]), _f(row[f"{lo}_{side}"]), _f(row[f"{hi}_{side}"]), digits=4)


def _f(v: Any) -> float:
    return math.nan if v is None or isinstance(v, str) else float(v)


def _diff(v: Any) -> str:
    return "-" if v is None or math.isnan(_f(v)) else f"{_f(v):+.4g}"


def _apart(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "NO")


def _grid(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    return ["  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip() for r in [header, *rows]]


def biggest(comp: RunComparison, top: int) -> list[dict]:
    """The ``top`` edge rows of both runs with the largest |B - A|, largest first (ties by method and name)."""
    both = [r for r in comp.edges if r["difference"] is not None]
    return sorted(both, key=lambda r: (-abs(r["difference"]), r["method"], str(r["name"])))[:top]


def _edge_lines(rows: list[dict]) -> list[str]:
    return _grid(["method", "edge", "A estimate [interval]", "B estimate [interval]", "B - A", "overlap"],
                 [[r["method"], str(r["name"]), _ci(r, "estimate", "ci_low", "ci_high", "a"),
                   _ci(r, "estimate", "ci_low", "ci_high", "b"), _diff(r["difference"]), _apart(r["overlap"])]
                  for r in rows])


def _k_lines(rows: list[dict], est: str, lo: str, hi: str) -> list[str]:
    return _grid(["method", "k", "A", "B", "B - A", "overlap"],
                 [[r["method"], str(r["k"]), _ci(r, est, lo, hi, "a"), _ci(r, est, lo, hi, "b"), _diff(r["difference"]),
                   _apart(r["overlap"])] for r in rows])


def edge_rows_text(comp: RunComparison) -> str:
    """The edge-row counts in words: a row is one method's edge, so a method one run lacks gives rows in one run."""
    c = comp.counts()

    def only(side: str, this, other) -> str:
        n = c[f"edges_only_{side}"]
        lacks = [m for m in this.methods if m not in other.methods]
        why = f" (method{'s' if len(lacks) != 1 else ''} {', '.join(lacks)}, which {'B' if side == 'a' else 'A'} " \
              "has not)" if n and lacks else ""
        return f"{n} in {side.upper()} only{why}"

    return (f"one per method and edge: {c['edges_both']} in both runs, {only('a', comp.a, comp.b)}, "
            f"{only('b', comp.b, comp.a)}")


def all_equal_text(comp: RunComparison) -> str | None:
    """One sentence when every edge row of both runs has the same estimate in A and B, else None."""
    both = [r for r in comp.edges if r["difference"] is not None]
    if not both or any(r["difference"] != 0 for r in both):
        return None
    ends = sum((r["ci_low_a"], r["ci_high_a"]) != (r["ci_low_b"], r["ci_high_b"]) for r in both)
    return (f"All {len(both)} edge-row estimates are equal in A and B (B - A = 0); "
            + (f"only the intervals differ ({ends} rows)." if ends else "the intervals are equal too."))


def _difference_lines(comp: RunComparison, top: int) -> list[str]:
    """The largest differences B - A, or one sentence when every shared estimate is equal."""
    equal = all_equal_text(comp)
    if equal is not None:
        return ["", equal]
    big = biggest(comp, top)
    n = sum(r["difference"] is not None for r in comp.edges)
    lines = ["", f"Largest differences B - A of the mean edge effect (top {len(big)} of {n} edge rows; --json "
                 "lists every edge):"]
    return lines + (_edge_lines(big) if big else ["(none)"])


def _head(comp: RunComparison) -> list[str]:
    c = comp.counts()
    items = [("run A", comp.a.label), ("run B", comp.b.label),
             ("models", f"A: {', '.join(comp.a.models) or '?'} | B: {', '.join(comp.b.models) or '?'}"),
             ("methods", f"A: {', '.join(comp.a.methods)} | B: {', '.join(comp.b.methods)}"),
             ("edge rows", edge_rows_text(comp)),
             ("intervals apart", f"{c['edges_flagged']} edge rows, {c['stability_flagged']} stability rows, "
                                 f"{c['faithfulness_flagged']} faithfulness rows (a flag to look at, not a test)")]
    if comp.claims is not None:
        items.append(("claims changed", str(c["claims_changed"])))
    items += [("note", n) for n in comp.notes]
    width = max(len(k) for k, _ in items)
    lines = [f"{k:<{width}}  {v}" for k, v in items]
    bar = "=" * min(100, max(len(s) for s in lines))
    return [bar, *lines, bar]


def summary_text(comp: RunComparison, top: int = 20) -> str:
    """Return the comparison as text: head, edges apart, the largest differences, stability, faithfulness, claims."""
    lines = _head(comp)
    flagged = comp.flagged_edges
    lines += ["", f"Edges whose intervals do not overlap ({len(flagged)}; showing at most {top}):"]
    lines += _edge_lines(flagged[:top]) if flagged else ["(none)"]
    lines += _difference_lines(comp, top)
    lead = stability_lead(comp)
    lines += ["", f"Circuit stability against k: {lead} [interval] ({STABILITY_ESTIMANDS[lead]}):"]
    lines += _k_lines(comp.stability, lead, f"{lead}_ci_low", f"{lead}_ci_high") \
        if comp.stability else ["(neither run has stability_vs_k)"]
    lines += ["", "Faithfulness against k: f_selected [interval] (selection included):"]
    lines += _k_lines(comp.faithfulness, "f_selected", "f_selected_ci_low", "f_selected_ci_high") \
        if comp.faithfulness else ["(neither run has faithfulness_vs_k)"]
    if comp.claims is not None:
        lines += ["", "Claims verdicts:"]
        lines += _grid(["claim", "A", "B", "changed"],
                       [[str(r["name"]), r["status_a"] or "(absent)", r["status_b"] or "(absent)",
                         "CHANGED" if r["changed"] else ""] for r in comp.claims]) if comp.claims else ["(none)"]
    return "\n".join(lines)
