"""The verified section: per approximate method, its verified edges (the mean exact effect, PPI++ on exact for a
random subset of prompts) beside the approximation's own mean, and the bound on missed edges."""

from __future__ import annotations

import numpy as np

from circuitstat.reports.ci import Ci
from circuitstat.reports.html.common import Tables, ci_html, html_table, note
from circuitstat.reports.html.svg import esc, fmt
from circuitstat.reports.tableset import methods_in, num, rows, where
from circuitstat.reports.verdicts.verified import (FLAG_CAP_WORDS, flag_capped, flag_yardstick, is_active_design,
                                                   verified_edge_lines)

__all__ = ["verified_section"]

SHOWN = 20  # verified edges listed per method (by |estimate|)


def _flag_words(flag) -> str:
    """Return the flag cell: yes, no, or not assessed (null: an active-design run made before its flag was built)."""
    return "not assessed" if flag is None else ("yes" if flag else "no")


def _method_table(T: Tables, method: str) -> str:
    t = where(T.get("verified"), method=method)
    order = np.argsort(-np.nan_to_num(np.abs(num(t, "estimate")), nan=-1.0), kind="stable")[:SHOWN]
    body = []
    for i in order:
        r = t.slice(int(i), 1).to_pylist()[0]
        body.append((str(r.get("edge_name") or r["edge"]),
                     ci_html(Ci.of("verified", r, ("method", "edge"), est="estimate")), r["qvalue"], r["approx_mean"],
                     r["lam"], _flag_words(r["no_tail_seen"])))
    coef = where(T.get("verified_coefficients"), method=method)
    combined = coef is not None and coef.num_rows > 0  # several methods as control variates (verify.combine)
    preds = list(dict.fromkeys(coef.column("predictor").to_pylist())) if combined else [method]
    est = str(t.column("estimand")[0]) if t.num_rows else ""
    cols = (("edge", "text"), ("mean exact effect [CI]", "html"), ("q (BH)", "num"), (f"{preds[0]} mean", "num"),
            ("Σ coefficients" if combined else "λ", "num"),
            (f"no tail seen, informative (≤ 2× {flag_yardstick(is_active_design(est))}"
             + (f", ≤ {FLAG_CAP_WORDS})" if flag_capped(t) else ")"), "text"))
    head = f"<h3>{esc(method)}: {esc(est)}</h3>"
    if combined:
        head += note(_design_words(coef, preds))
    return head + html_table(cols, body, shown_note=f"{len(body)} of {t.num_rows} verified edges, largest |estimate| "
                                                    "first")


def _design_words(coef, preds: list[str]) -> str:
    """Return the note on a combination: its design (the library's name) and each method's median coefficient."""
    c, p = num(coef, "coefficient"), coef.column("predictor").to_pylist()
    medians = ", ".join(f"{m} {fmt(float(np.median(c[[q == m for q in p]])))}" for m in preds)
    return (f"{' and '.join(preds)} together as control variates: {coef.column('design')[0].as_py()} "
            f"(verified_coefficients; median coefficient: {medians}).")


def verified_section(T: Tables) -> str:
    """Return the section's HTML: the verdict's verified lines, then each method's table and missed-edges bound."""
    lines = "".join(f"<li>{esc(ln.text())}</li>" for ln in verified_edge_lines(T))
    parts = [note("Intervals for the mean exact (activation-patching) effect: the approximation on every prompt, "
                  "exact patching on a uniformly random subset (or, with the active design, on (prompt, edge) cells "
                  "sampled with probabilities from the approximation), combined per edge by PPI++ (docs/verified.md). "
                  "The approximation's own mean is a different estimand, shown beside it."),
             f"<ul>{lines}</ul>"]
    for m in methods_in(T.get("verified")):
        parts.append(_method_table(T, m))
        for r in rows(T.get("missed_edges"), method=m):
            parts.append(note(f"{m}: {r['estimand']}: at most {int(r['missed_high'])} of {int(r['n_unverified'])} "
                              f"unverified edges ({int(r['sampled_above'])} of {int(r['n_sampled'])} sampled edges "
                              "possibly above τ)" + (f"; their summed |mean exact effect| is at most "
                                                     f"{fmt(r['mass_high'])} (level {fmt(r['mass_level'])}, "
                                                     f"{r['mass_method']})" if r.get("mass_high") is not None
                                                     else "") + "."))
    return "".join(parts)
