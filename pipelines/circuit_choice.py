"""What ``circuitstat circuit`` selects from a run, said out loud: which method's scores, which ranking,
and why a circuit came out empty.

A run from ``attribute`` holds one method's scores (``scores.parquet``); an audit holds one table per
method (``scores_<method>.parquet``). Without ``--method`` the command takes exact patching when the run
has it (the reference the approximations are measured against), else the audit's first method, and
prints which one it took and which others there are. Without ``--ranking`` it ranks as the
run did: an audit's recorded ``ranking`` (the audit's stability and faithfulness used it), and |score|
for an attribute run (the audit's default), since effects are metric(patched) - metric(clean) and the
edges a behaviour needs are usually negative: ranking them by signed score puts them last.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.words import counted

PREFERRED_METHOD = "exact"
"""Taken first when a run has several methods: the other methods approximate it."""


@dataclass(frozen=True)
class ScoreChoice:
    """The scores table a ``circuit`` command reads, the method in it, and the sentence that says why."""

    table: str
    method: str
    reason: str


def _manifest_spec(run: Path) -> dict:
    """The run's recorded spec ({} when the directory has no readable manifest)."""
    from circuitstat.core.rundir import RunDir, RunDirError

    try:
        spec = RunDir.read_manifest(run).get("spec")
    except RunDirError:
        return {}
    return spec if isinstance(spec, dict) else {}


def run_methods(run: Path) -> list[str]:
    """The methods whose scores an audit run holds, in the order its spec lists them (then any others)."""
    found = {p.stem[len("scores_"):] for p in Path(run).glob("scores_*.parquet")}
    listed = [m for m in _manifest_spec(run).get("methods", []) if m in found]
    return listed + sorted(found - set(listed))


def choose_scores(run: Path, method: str | None) -> ScoreChoice:
    """The scores table of ``method`` in ``run``, or the run's best one when ``method`` is None (see module doc)."""
    run = Path(run)
    single = (run / "scores.parquet").exists()
    methods = run_methods(run)
    if single:
        recorded = str(_manifest_spec(run).get("method", "")) or None
        if method is not None and recorded is not None and method != recorded:
            raise InputError(f"{run} holds {recorded} scores only (an attribute run); drop --method or run "
                             f"`circuitstat attribute --method {method}`")
        return ScoreChoice("scores", recorded or method or "unknown", "the run's only scores")
    if not methods:
        raise InputError(f"{run} has no scores; run `circuitstat attribute` or `circuitstat audit` first")
    if method is not None:
        if method not in methods:
            raise InputError(f"{run} has no {method} scores; it has {', '.join(methods)}: pass --method "
                             f"{methods[0]}")
        return ScoreChoice(f"scores_{method}", method, "as asked")
    chosen = PREFERRED_METHOD if PREFERRED_METHOD in methods else methods[0]
    others = [m for m in methods if m != chosen]
    if not others:
        return ScoreChoice(f"scores_{chosen}", chosen, "the run's only method")
    why = "exact patching, which the others approximate" if chosen == PREFERRED_METHOD else "the audit's first method"
    return ScoreChoice(f"scores_{chosen}", chosen,
                       f"{why}; the run also has {', '.join(others)}: pass --method {others[0]} for it")


def default_ranking(run: Path) -> tuple[str, str]:
    """(ranking, why) when the command line names no ranking: the audit's recorded one, else absolute."""
    ranking = _manifest_spec(run).get("ranking")
    if ranking in ("absolute", "signed"):
        return ranking, "the audit's ranking"
    return "absolute", "the default: effects the behaviour needs are usually negative"


def header_line(choice: ScoreChoice, ranking: str, ranking_reason: str, k: int, rule: str, prune: bool) -> str:
    """One line that says what the circuit below was selected from and how."""
    absolute = ranking == "absolute"
    other = "--ranking signed" if absolute else "--ranking absolute"
    ranked = "|score|" if absolute else "signed score"
    return (f"{rule} circuit of k={k} edges from {choice.method} scores ({choice.reason}); ranked by {ranked} "
            f"({ranking_reason}; {other} for the other ranking){'; pruned to input -> logits paths' if prune else ''}")


def empty_explanation(scores: np.ndarray, selected: np.ndarray, k: int, ranking: str, pruned: bool) -> str:
    """Why a circuit came out with no edge, and what to pass instead (``selected``: the edges before pruning)."""
    absolute = ranking == "absolute"
    if not pruned or not selected.any():
        return f"no edge was selected at k={k}; use a larger --k"
    picked = scores[selected]
    parts = [f"the top {counted(int(selected.sum()), 'edge')} by {'|score|' if absolute else 'signed score'} "
             f"(scores {picked.min():+.3g} to {picked.max():+.3g}) form no path from input to logits, so pruning "
             "removed every one"]
    finite = scores[np.isfinite(scores)]
    if not absolute and finite.size and -finite.min() > finite.max():
        parts.append(f"the largest effects are negative (down to {finite.min():+.3g}; effects are metric(patched) - "
                     "metric(clean), so the edges the behaviour needs are negative) and signed ranking puts them "
                     "last: pass --ranking absolute")
    else:
        parts.append("pass a larger --k" + ("" if absolute else " or --ranking absolute"))
    parts.append("or --no-prune to see the selected edges")
    return "; ".join(parts)
