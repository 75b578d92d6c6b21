"""The verdict's data: `Line` (one verdict with its intervals), `Verdict` (the run's lines) and the rules' constants.

Every interval in a line is a `circuitstat.reports.ci.Ci` read from the column the claims check reads, so the
terminal and the page render the same numbers from the same place (circuitstat.reports.verdicts.build).

Verdict rules (also stated in the summary itself):
* k: fixed-sequence testing down the spec's k grid — the smallest k such that it and every larger k
  have a selection-aware faithfulness lower bound at or above the bar (0.8); this controls the
  family-wise error over the grid without adjustment. No k passes: the largest k. No faithfulness: the smallest k.
* stability: the data-level interval of J_{N/2}, the expected Jaccard between the top-k circuits of two
  independent datasets of N/2 prompts (jaccard_half_ci_*, exactly estimable from disjoint halves; runs from
  before it: J_N, jaccard_data_ci_*): stable above the bar, unstable below it, inconclusive across it; chance
  (the null) is stated beside it.
* faithfulness: f_selected_ci_* (the circuit selected from N prompts, selection included) against the
  same bar; the fixed-circuit f_ci_* only where the run has no selection-aware interval, labelled.
* edges: Benjamini-Hochberg q <= 0.05 over every edge; "!" marks intervals a few prompts carry.
* approximation: the interval of the Spearman of mean scores against exact (its expected value at N): lower end
  >= 0.9 agrees, >= 0.5 a rough guide, upper end < 0.5 does not, otherwise inconclusive.
* heads: a head is above its shuffled null when its excess interval over training seeds lies above the
  minimum excess (heads.min_excess, default 0.1); each head's own interval, not adjusted over heads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from circuitstat.reports.analyses import Analysis
from circuitstat.reports.ci import Ci
from circuitstat.reports.tableset import rows
from circuitstat.reports.thresholds import MIN_EXCESS, MIN_EXCESS_BOUNDS

__all__ = ["BAR", "SIGNIFICANT_Q", "TOP_EDGES", "APPROX_RULES", "CLAIM_SECTIONS", "NEEDS_SEEDS", "Part", "Line",
           "Verdict", "Name", "Quote", "NBSP", "run_spec", "against_bar", "MIN_EXCESS", "MIN_EXCESS_BOUNDS"]

BAR = 0.8  # the stability and faithfulness bar of the verdicts (the variance study's default bar and target too)
SIGNIFICANT_Q = 0.05
TOP_EDGES = 3  # circuit edges named on the first screen
APPROX_RULES = ((0.9, "ranks edges like exact", "good"), (0.5, "a rough guide to exact", "unsure"),
                (-math.inf, "does not rank edges like exact", "bad"))
CLAIM_SECTIONS = {"edge_in_circuit": "graph", "circuit_stability": "stability", "faithfulness": "faithfulness",
                  "edge_effect": "forest", "head_stability": "heads", "layer_stability": "heads",
                  "approximation": "approximation", "verified_edge": "verified",
                  "missed_edges": "verified"}  # the token kinds: "tokens"
NEEDS_SEEDS = "needs ≥ 3 seeds"

NBSP = "\u00a0"



class Name(str):
    """A name in a line (an edge, a head) that the page sets in code type; the terminal prints it as it is."""


@dataclass(frozen=True)
class Quote:
    """Text quoted verbatim from one cell of a run table (a claim's reason, as `circuitstat check` recorded it)."""

    table: str
    key: tuple[tuple[str, Any], ...]
    column: str
    text: str


Part = Union[str, Ci, Quote]  # a Name is a str


@dataclass(frozen=True)
class Line:
    """One verdict line: what it is about, the verdict in plain words, its sentence and the section it links to."""

    label: str
    verdict: str
    tone: str  # good | bad | unsure | info
    parts: tuple[Part, ...]  # text and intervals, in reading order
    section: str  # the report section's anchor

    @property
    def cis(self) -> tuple[Ci, ...]:
        """Return the intervals of the line."""
        return tuple(p for p in self.parts if isinstance(p, Ci))

    def text(self, hold: bool = False) -> str:
        """Return the sentence as plain text: intervals as ``estimate [low, high]``, '!' when unreliable, then any
        label; with `hold`, each interval's spaces are non-breaking (for wrapping)."""
        out = []
        for p in self.parts:
            if isinstance(p, (str, Quote)):
                out.append(p if isinstance(p, str) else p.text)
                continue
            t = p.text() + ("!" if p.reliable is False else "")
            out.append((t.replace(" ", NBSP) if hold else t) + (f" ({p.role})" if p.role else ""))
        return "".join(out)


@dataclass(frozen=True)
class Verdict:
    """The run's one-screen verdict: its lines, what the run lacks and the rules the verdicts follow."""

    run_dir: Path
    method: str | None
    k: int | None
    lines: tuple[Line, ...]
    not_run: tuple[Analysis, ...]
    rules: tuple[str, ...]
    level: float = 0.95


def run_spec(run_dir: Path) -> dict[str, Any]:
    """Return the spec recorded in the run's manifest ({} without a readable manifest)."""
    from circuitstat.core.rundir import MANIFEST, RunDir, RunDirError

    if not (run_dir / MANIFEST).exists():
        return {}
    try:
        spec = RunDir.read_manifest(run_dir).get("spec")
    except RunDirError:
        return {}
    return spec if isinstance(spec, dict) else {}


def against_bar(ci: Ci, good: str, bad: str) -> tuple[str, str]:
    """Return (verdict, tone) of an interval against the bar: above, below or across it."""
    if not ci.defined:
        return "no interval", "unsure"
    if ci.lo >= BAR:
        return good, "good"
    if ci.hi < BAR:
        return bad, "bad"
    return "inconclusive", "unsure"
