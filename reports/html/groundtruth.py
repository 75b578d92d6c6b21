"""The ground-truth study's HTML section: ROC curves, precision/recall against N, FDR calibration, with intervals.

``groundtruth_section(tables)`` takes the run's tables (``groundtruth_models``, ``groundtruth_summary``,
``groundtruth_fdr``, ``groundtruth_roc``; pyarrow Tables as RunTables.tables() returns them) and returns
the section's HTML.  Every band and error bar is the t interval over datasets whose estimand the caption
and the table name (the expected value of the statistic for a dataset of N prompts); numbers are read
from the same columns the summary lines and docs read.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from circuitstat.reports.html.common import Tables, colours, figure, html_table, note, order_methods
from circuitstat.reports.html.svg import Plot, esc

__all__ = ["groundtruth_section"]

TABLES = ("groundtruth_models", "groundtruth_summary", "groundtruth_fdr", "groundtruth_roc")


def _rows(t: pa.Table) -> list[dict[str, Any]]:
    return t.to_pylist()


def _roc_figure(roc: list[dict], model: str, n: int, methods: Sequence[str]) -> str:
    col = colours(methods)
    p = Plot(300, 260, (0.0, 1.0), (0.0, 1.0), label=f"ROC of {model} at N={n}")
    p.axes("false positive rate", "true positive rate")
    p.line([0, 1], [0, 1], "#999", dash="3,3", width=1.0)
    for m in methods:
        r = sorted((x for x in roc if x["model"] == model and x["method"] == m and x["n"] == n), key=lambda x: x["fpr"])
        if not r:
            continue
        xs = np.array([x["fpr"] for x in r])
        p.band(xs, [x["tpr_ci_low"] for x in r], [x["tpr_ci_high"] for x in r], col[m])
        p.line(xs, [x["tpr"] for x in r], col[m], title=m)
        p.legend(m, col[m])
    return p.svg()


def _vs_n_figure(summary: list[dict], model: str, statistic: str, param: str, methods: Sequence[str],
                 ylabel: str) -> str:
    col = colours(methods)
    ns = sorted({r["n"] for r in summary if r["model"] == model})
    p = Plot(300, 260, (min(ns) / 1.3, max(ns) * 1.3), (0.0, 1.05), xlog=True, label=f"{ylabel} against N, {model}")
    p.axes("prompts per dataset (N)", ylabel, xticks=ns)
    for j, m in enumerate(methods):
        r = sorted((x for x in summary if (x["model"], x["method"], x["family"], x["statistic"], x["param"])
                    == (model, m, "topk", statistic, param)), key=lambda x: x["n"])
        if not r:
            continue
        xs = np.array([x["n"] for x in r], float) * (1 + 0.03 * (j - len(methods) / 2))  # dodge the error bars
        for x, row in zip(xs, r):
            if np.isfinite(row["ci_low"]):
                p.vbar(x, row["ci_low"], row["ci_high"], col[m])
        p.line(xs, [x["estimate"] for x in r], col[m], title=m)
        p.points(xs, [x["estimate"] for x in r], col[m])
        p.legend(m, col[m])
    return p.svg()


def _ci(row: Mapping[str, Any] | None) -> str:
    if row is None or not np.isfinite(row["estimate"]):
        return "—"
    if not np.isfinite(row["ci_low"]):
        return f"{row['estimate']:.3f}"
    return f"{row['estimate']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _summary_table(summary: list[dict], models: list[dict], n: int, methods: Sequence[str]) -> str:
    index = {(r["model"], r["method"], r["n"], r["family"], r["statistic"], r["param"]): r for r in summary}
    rows = []
    for mod in models:
        k = mod["n_true"]
        for m in methods:
            get = lambda fam, st, par="": index.get((mod["model"], m, n, fam, st, par))  # noqa: E731
            if get("ranking", "auroc") is None:
                continue
            rows.append([mod["model"], m, _ci(get("ranking", "auroc")), _ci(get("ranking", "auroc_pessimistic")),
                         _ci(get("topk", "precision", f"k={k}")), _ci(get("topk", "recall", f"k={k}")),
                         _ci(get("faithfulness", "fixed_covers_truth")), _ci(get("faithfulness", "fixed_bounded"))])
    cols = [("model", "text"), ("method", "text"), ("AUROC", "text"), ("pessimistic AUROC", "text"),
            ("precision top-|C|", "text"), ("recall top-|C|", "text"), ("f(C) Fieller set covers 1", "text"),
            ("Fieller set bounded (an unbounded set covers trivially)", "text")]
    return html_table(cols, rows)


def _fdr_table(fdr: list[dict]) -> str:
    cols = [("model", "text"), ("method", "text"), ("N", "int"), ("test", "text"), ("alpha", "num"),
            ("realised FDR", "num"), ("± MC SE", "num"), ("verdict", "text"), ("power", "num"),
            ("power interval", "text")]
    rows = [[r["model"], r["method"], r["n"], r["test"], r["alpha"], r["fdr"], r["fdr_mc_se"], r["verdict"], r["power"],
             f"[{r['power_ci_low']:.3f}, {r['power_ci_high']:.3f}]"] for r in fdr if r["model"].startswith("planted")]
    return html_table(cols, rows)


def _stability_table(summary: list[dict]) -> str:
    index = {(r["model"], r["method"], r["n"], r["statistic"], r["param"]): r for r in summary
             if r["family"] == "stability"}
    rows = []
    for (model, method, n, stat, param), r in sorted(index.items()):
        if stat != "false_edges":
            continue
        bound = index.get((model, method, n, "pfer_bound_mb", param))
        rows.append([model, method, n, param.split("=")[1], _ci(r), bound["estimate"] if bound else float("nan"),
                     bool(bound and r["estimate"] <= bound["estimate"])])
    cols = [("model", "text"), ("method", "text"), ("N", "int"), ("threshold", "text"),
            ("false edges selected", "text"), ("MB bound on E[V]", "num"), ("within bound", "bool")]
    return html_table(cols, rows)


def groundtruth_section(tables: Mapping[str, pa.Table]) -> str:
    """Return the HTML body of the ground-truth section for the run's tables (a note when they are missing)."""
    missing = [t for t in TABLES if t not in tables]
    if missing:
        return note("not in this run: " + ", ".join(missing))
    models, summary = _rows(tables["groundtruth_models"]), _rows(tables["groundtruth_summary"])
    fdr, roc = _rows(tables["groundtruth_fdr"]), _rows(tables["groundtruth_roc"])
    methods = order_methods(sorted({r["method"] for r in summary}))
    n = max(r["n"] for r in summary)
    estimand = summary[0]["estimand"] if summary else ""
    parts = [note('Every interval: ' + estimand + '.'),
             f"<h3>Discovery against the truth at N = {n}</h3>", _summary_table(summary, models, n, methods)]
    for mod in models:
        name, k, n_edges = mod["model"], mod["n_true"], mod["n_edges"]
        parts.append(f"<h3>{esc(name)}</h3>" + note(f"{mod['describe']}; {k} true of {n_edges} edges"))
        parts.append(figure(_roc_figure(roc, name, n, methods), f"Edge ROC (|mean score|) at N = {n}, averaged over "
                            "datasets; band: t interval of the mean TPR over datasets."))
        for stat, label in (("precision", "precision"), ("recall", "recall")):
            parts.append(figure(_vs_n_figure(summary, name, stat, f"k={k}", methods, f"{label} of the top-{k} circuit"),
                                f"{label.capitalize()} of the top-|C| circuit against N; bars: t interval over datasets."))
    parts += ["<h3>FDR calibration on planted models</h3>",
              note("Realised FDR (mean false discovery proportion of the edges with q <= alpha) against alpha; it "
                   "holds when it is at most alpha plus 2 Monte Carlo SEs; 'trivial': no false discovery at all."),
              _fdr_table(fdr), "<h3>Stability selection against the truth</h3>",
              note("False edges with inclusion frequency >= threshold over half-size subsamples of the top-|C| "
                   "circuit (mean over datasets, t interval) against the Meinshausen-Buhlmann bound on their "
                   "expected number."), _stability_table(summary)]
    return "".join(parts)


def groundtruth_part(T: Tables) -> str:
    """Return the ground-truth section's body from a run directory's tables (the report's part)."""
    return groundtruth_section({t: T.get(t) for t in TABLES if T.has(t)})
