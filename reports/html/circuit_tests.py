"""The circuit tests section: the hypothesis tests of one circuit (Shi et al., NeurIPS 2024) with what each
null says and what rejecting it means, the selection/testing split, and the per-edge minimality family."""

from __future__ import annotations

import json

import numpy as np

from circuitstat.core.schema import DANGLING_REASON
from circuitstat.reports.html.common import Tables, html_table, note
from circuitstat.reports.html.svg import esc
from circuitstat.reports.tableset import methods_in, num, rows, where
from circuitstat.reports.verdicts.circuit_tests import ALPHA, test_decision

__all__ = ["circuit_tests_section", "ALPHA"]

SHOWN = 30  # minimality edges listed per method (smallest adjusted p-value first)


def _decision(test: str, p: float) -> str:
    """Return the section's word for a test at ALPHA (the verdict's rule: circuitstat.reports.verdicts)."""
    return test_decision(test, p)[1]


def _interval(r: dict) -> str:
    """Return the statistic's Clopper-Pearson interval as text ("" for runs before the column, and for HSIC)."""
    low, high = r.get("statistic_low"), r.get("statistic_high")
    if low is None or high is None or not (np.isfinite(low) and np.isfinite(high)):
        return ""
    return f"[{low:.3f}, {high:.3f}]"


def _tests_table(T: Tables, method: str) -> str:
    t = rows(T.get("circuit_tests"), method=method)
    body = [(r["test"], r["statistic"], _interval(r), r["pvalue"], _decision(r["test"], r["pvalue"]), r["null"],
             r["rejection_means"]) for r in t]
    cols = (("test", "text"), ("statistic", "num"), ("95% interval (Clopper-Pearson)", "text"), ("p-value", "num"),
            (f"at α = {ALPHA:g}", "text"), ("null hypothesis", "text"), ("rejecting it means", "text"))
    r0 = t[0]
    seed = json.loads(r0["split_seed"]).get("entropy", "") if r0["split_seed"] else ""
    split = (f"{r0['k']}-edge circuit; {r0['selection']}. Selection prompts: {r0['n_select']}, testing prompts: "
             f"{r0['n_test']} (split seed entropy {seed}); {r0['n_random']} random connected circuits and inflated "
             f"circuits (random input -> logits paths); "
             f"minimality family adjusted by {r0['correction']}.")
    return f"<h3>{esc(method)}</h3>" + note(split) + html_table(cols, body)


def _minimality_table(T: Tables, method: str) -> str:
    t = where(T.get("circuit_minimality"), method=method)
    if t is None or t.num_rows == 0:
        return ""
    order = np.argsort(num(t, "pvalue_adjusted"), kind="stable")[:SHOWN]
    body = []
    for i in order:
        r = t.slice(int(i), 1).to_pylist()[0]
        decision = "redundant" if r["pvalue_adjusted"] <= ALPHA else "needed"
        if r.get("dangling"):  # the reason the claims check gives too (runs before the column: no reason)
            decision += f" ({DANGLING_REASON})"
        body.append((r["name"], r["effect"], r["count"] / r["n_random"], r["pvalue"], r["pvalue_adjusted"], decision))
    cols = (("edge", "text"), ("knockout effect", "num"), ("share of references beaten", "num"), ("p", "num"),
            ("adjusted p", "num"), (f"at α = {ALPHA:g}", "text"))
    return html_table(cols, body, shown_note=f"{len(body)} of {t.num_rows} edges, smallest adjusted p first")


def circuit_tests_section(T: Tables) -> str:
    """Return the section's HTML: per tested circuit, its tests and the minimality family."""
    parts = [note("Equivalence (the paper's direction), independence and minimality take the circuit hypothesis as "
                  "their null: passing them is no evidence against the circuit, not proof of it (their power grows "
                  "with the testing prompts; docs/hypothesis-tests.md). equivalence_tost swaps the null: it passes "
                  "only when equivalence is affirmed. Sufficiency and partial necessity pass only when their null "
                  "(no better than random connected circuits of the same size, at the paper's quantile) is rejected.")]
    for m in methods_in(T.get("circuit_tests")):
        parts.append(_tests_table(T, m))
        parts.append(_minimality_table(T, m))
    return "".join(parts)
