"""The verdict's lines for the circuit tests stage (Shi et al. 2024; issue 47): one line per test of the tested
circuit, with what the test says at ALPHA, its statistic (P̂(Δ > 0), Ĝ, the weakest edge's share) and that
statistic's Clopper-Pearson interval, read from the circuit_tests columns the claims check reads."""

from __future__ import annotations

import math

from circuitstat.reports.ci import Ci
from circuitstat.reports.tableset import Tables, methods_in, rows
from circuitstat.reports.verdicts.model import Line, Part

__all__ = ["ALPHA", "LABELS", "REJECT_SUPPORTS", "test_decision", "circuit_test_lines"]

ALPHA = 0.05  # the level the verdict and the report's section decide at (claims choose their own)
#: whether the circuit hypothesis is supported when the test's null is rejected
REJECT_SUPPORTS = {"equivalence": False, "equivalence_tost": True, "independence": False, "minimality": False,
                   "sufficiency": True, "partial_necessity": True}
#: the terminal's label column is 14 wide: each test's label fits it
LABELS = {"equivalence": "equivalence", "equivalence_tost": "equiv. (TOST)", "independence": "independence",
          "minimality": "minimality", "sufficiency": "sufficiency", "partial_necessity": "partial nec."}
_WHAT = {"equivalence": "P̂(circuit > model) ", "equivalence_tost": "P̂(circuit > model) ",
         "independence": "HSIC ", "minimality": "weakest edge beats a share ",
         "sufficiency": "Ĝ (random circuits beaten) ", "partial_necessity": "Ĝ (random complements beaten) "}


def test_decision(test: str, p: float) -> tuple[bool, str]:
    """Return (whether the circuit passes ``test`` at ALPHA, the words: passes/fails and whether the null fell)."""
    rejected = p <= ALPHA
    ok = rejected == REJECT_SUPPORTS.get(test, True)
    return ok, ("passes" if ok else "fails") + (" (null rejected)" if rejected else " (null not rejected)")


def _line(r: dict) -> Line:
    """Return one test's line: its decision, statistic with its interval (when the run has one) and p-value."""
    ok, words = test_decision(r["test"], float(r["pvalue"]))
    head: tuple[Part, ...] = (f"circuit test {r['test']} of {r['method']}'s {int(r['k'])}-edge circuit on "
                              f"{int(r['n_test'])} prompts: {_WHAT.get(r['test'], '')}",)
    low, high = r.get("statistic_low"), r.get("statistic_high")
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        stat: tuple[Part, ...] = (Ci.of("circuit_tests", r, ("method", "test"), "statistic", est="statistic",
                                        flag="", decimals=3),)
    else:
        stat = (f"{float(r['statistic']):.3g}",)
    tail = f"; p = {float(r['pvalue']):.3g}" + (f": {r['rejection_means']}" if r["pvalue"] <= ALPHA else "")
    return Line(LABELS.get(r["test"], r["test"][:13]), words, "good" if ok else "bad", head + stat + (tail,), "circuit_tests")


def circuit_test_lines(T: Tables) -> list[Line]:
    """Return one line per circuit test of each tested circuit, [] when the run has no tests stage."""
    t = T.get("circuit_tests")
    if t is None or t.num_rows == 0:
        return []
    return [_line(r) for m in methods_in(t) for r in rows(t, method=m)]
