"""The analyses a run directory can hold, the tables that show each one ran, and how to run a missing one.

The verdict summary (circuitstat.reports.verdicts) says in one line which analyses a run lacks and how to run
them; the HTML report (circuitstat.reports.html.sections) shows a section only when its analysis is present.
Both read this one list, so the page never shows a box for what the run lacks and the summary
never offers a command for what it has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from circuitstat.reports.tableset import Tables

__all__ = ["Analysis", "ANALYSES", "TOKEN_TABLES", "SEED_TABLES", "present", "missing", "token_model_dirs",
           "has_tokens"]

TOKEN_TABLES = ("token_weights", "token_importance", "token_importance_diffs", "sink_heads", "sink_fit")
SEED_TABLES = ("token_stability", "sink_stability", "sink_matching")
_MODEL_DIR = re.compile(r"^model-(\d+)$")


@dataclass(frozen=True)
class Analysis:
    """One analysis: its id, its name in words, the tables any of which shows it ran, and how to run it."""

    id: str
    name: str
    tables: tuple[str, ...]
    how: str
    part_of_audit: bool = True  # a stage of `circuitstat audit` (listed alone only when the audit ran)
    offered: bool = True  # listed as "not in this run" when absent (a benchmark of the methods is not)


ANALYSES: tuple[Analysis, ...] = (
    Analysis("audit", "circuit audit (edge effects, circuit stability)", ("edge_stats", "stability_vs_k", "inclusion"),
             "circuitstat audit SPEC --out DIR", part_of_audit=False),
    Analysis("faithfulness", "faithfulness", ("faithfulness_vs_k",), "faithfulness: true in the audit spec"),
    Analysis("approximation", "approximation error", ("approximation_summary", "approximation"),
             "methods: [exact, eap] in the audit spec"),
    Analysis("heads", "head stability across seeds", ("heads", "layers", "residual"),
             "two or more seeds under models: in the audit spec"),
    Analysis("variance", "variance study", ("variance_components", "variance_summary"),
             "circuitstat study variance SPEC --out DIR", part_of_audit=False),
    Analysis("calibration", "calibration of the intervals", ("coverage",),
             "circuitstat study calibration SPEC --out DIR", part_of_audit=False),
    Analysis("tokens", "token contributions and attention sinks", TOKEN_TABLES + SEED_TABLES,
             "circuitstat tokens --model SRC --out DIR", part_of_audit=False),
    Analysis("groundtruth", "ground-truth discovery", ("groundtruth_summary",),
             "circuitstat study groundtruth SPEC --out DIR", part_of_audit=False, offered=False),
    Analysis("verified", "verified run (exact on a random subset of prompts)", ("verified",),
             "verify: {n: 16} in the audit spec, or attribute --verify 16", part_of_audit=False, offered=False),
    Analysis("published", "published circuit checked on this run", ("published_circuit",),
             "circuit: {file: FILE} in the audit spec, or circuitstat check-circuit", part_of_audit=False, offered=False),
    Analysis("circuit_tests", "hypothesis tests of a circuit", ("circuit_tests",),
             "tests: {k: K} in the audit spec", part_of_audit=False, offered=False),
    Analysis("claims", "claims check", ("claims",), "circuitstat check CLAIMS --run DIR", part_of_audit=False),
)
_BY_ID = {a.id: a for a in ANALYSES}


def token_model_dirs(run_dir: Path) -> list[Path]:
    """Return the model-<i>/ parts of a cross-seed tokens run that hold a tokens table, in model order."""
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _MODEL_DIR.match(p.name))]
    return [p for _, p in sorted(found) if any((p / f"{t}.parquet").exists() for t in TOKEN_TABLES)]


def has_tokens(T: Tables) -> bool:
    """Return whether the run holds tables of ``circuitstat tokens`` (at its top or under model-<i>/)."""
    return any(T.path(t).exists() for t in TOKEN_TABLES + SEED_TABLES) or bool(token_model_dirs(T.dir))


def present(T: Tables, analysis: str) -> bool:
    """Return whether analysis `analysis` (an id of ANALYSES) ran: one of its tables has rows."""
    if analysis == "tokens":
        return has_tokens(T)
    return any(T.has(t) for t in _BY_ID[analysis].tables)


def missing(T: Tables) -> list[Analysis]:
    """Return the analyses the run lacks, in ANALYSES order; an audit's own stages only in an audit's run.

    (A variance study writes the audit's core tables too, but its stages are set by its own spec.)"""
    audit_run = present(T, "audit") and not present(T, "variance")
    return [a for a in ANALYSES
            if a.offered and not present(T, a.id) and (audit_run or not a.part_of_audit)]
