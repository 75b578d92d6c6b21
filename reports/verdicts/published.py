"""The verdict's first lines when the run audits a published circuit (spec key ``circuit``, ``check-circuit``;
issue 47): what was asked comes first -- the circuit's faithfulness (Fieller's set, or why there is none), its
CPR/CMD, its edges without support and their inclusion -- before the run's own top-k circuit."""

from __future__ import annotations

import math

from circuitstat.reports.ci import Ci
from circuitstat.reports.tableset import Tables, rows
from circuitstat.reports.verdicts.model import BAR, Line, Part, Quote, against_bar

__all__ = ["published_lines"]


def _row(T: Tables, method: str | None) -> dict | None:
    found = rows(T.get("published_circuit"), method=method) if method else []
    return (found or rows(T.get("published_circuit")) or [None])[0]


def published_lines(T: Tables, method: str | None) -> list[Line]:
    """Return the published circuit's two lines (faithfulness; support and inclusion), [] when the run has none."""
    r = _row(T, method)
    if r is None:
        return []
    key = ("method",)
    head: tuple[Part, ...] = (f"{r['circuit']} ({int(r['n_edges'])} edges): faithfulness ",)
    if r.get("f_ci_note"):  # Fieller's set is no bounded interval: the words the table, page and claims quote
        parts = head + (f"{r['f_ratio']:.3f}, but ", Quote("published_circuit", (("method", r["method"]),),
                                                            "f_ci_note", str(r["f_ci_note"])))
        verdict, tone = "no interval", "unsure"
    else:
        ci = Ci.of("published_circuit", r, key, "f_ci", est="f_ratio", flag="", decimals=3)
        parts = head + (ci, f"; bar {BAR}")
        verdict, tone = against_bar(ci, "faithful", "not faithful")
    if r.get("cpr") is not None and math.isfinite(r["cpr"]):
        parts += ("; CPR ", Ci.of("published_circuit", r, key, "cpr_ci", est="cpr", flag="", decimals=3),
                  ", CMD ", Ci.of("published_circuit", r, key, "cmd_ci", est="cmd", flag="", decimals=3))
    faith = Line("published", verdict, tone, parts, "published")
    n, bad = int(r["n_edges"]), int(r["n_unsupported"])
    support = Line("its edges", f"{bad} of {n} unsupported", "good" if bad == 0 else "unsure",
                   (f"{r['method']}: {bad} of {n} edges not supported at q ≤ {r['q_level']:g}; inclusion in "
                    f"resampled top-{n} circuits mean {r['inclusion_mean']:.2f}, least {r['inclusion_min']:.2f}; "
                    f"Jaccard with this run's own top-{n} {r['topk_jaccard']:.2f}",), "published")
    return [faith, support]
