"""A synthetic run shaped like the demo's (an audit over seeds on a small graph), for the HTML report's tests.

``make_report_run`` writes every table the demo's audit writes — edges in the EAP-IG/MIB naming,
edge_stats with some edges a few prompts carry (no_tail_seen false), the data-level stability columns, selection-aware
faithfulness, approximation, heads and layers with their intervals over seeds, residual CKA and the
heads stage's summary — and, optionally, a variance study's tables. Columns it does not set are filled
from core/schema.py, so it cannot drift from what the audit writes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill, schema_for
from circuitstat.core.tables import write_table

EVIL = '<script>alert("pwned")</script>&\'"'
KNOWN = {"estimate": 1.23456, "ci_low": 0.987654, "ci_high": 1.48765, "q": 0.000123}
KS = [5, 10, 20, 50, 100]


def graph_edges(n_layers: int, n_heads: int) -> dict[str, list]:
    """Edge table in the EAP-IG/MIB naming (as circuitstat.circuits.graph.ComponentGraph.edge_table builds it)."""
    senders, s_layer = ["input"], [-1]
    for layer in range(n_layers):
        senders += [f"a{layer}.h{h}" for h in range(n_heads)] + [f"m{layer}"]
        s_layer += [layer] * (n_heads + 1)
    cols: dict[str, list] = {k: [] for k in ("index", "name", "sender", "receiver", "sender_layer", "receiver_layer", "kind")}

    def add(receiver: str, r_layer: int, kind: str, n_up: int) -> None:
        for u in range(n_up):
            for c, v in zip(cols, (len(cols["index"]), f"{senders[u]}->{receiver}", senders[u], receiver, s_layer[u],
                                   r_layer, kind)):
                cols[c].append(v)

    for layer in range(n_layers):
        up = 1 + layer * (n_heads + 1)
        for kind in "qkv":
            for h in range(n_heads):
                add(f"a{layer}.h{h}<{kind}>", layer, kind, up)
        add(f"m{layer}", layer, "mlp", up + n_heads)
    add("logits", n_layers, "logits", len(senders))
    return cols


def write_recorded(table: dict, path: Path) -> None:
    """Write ``table`` as it is into run ``path.parent`` and record it in the run's manifest (a table the run wrote)."""
    from circuitstat.core.run_check import record_tables

    write_table(table, path)
    record_tables(path.parent, [path])


def write_filled(table: dict, path: Path) -> None:
    """Write a fixture table, completed to its registered schema (core/schema.py) when it has one."""
    n = len(next(iter(table.values())))
    write_table(fill(path.stem, table, n) if schema_for(path.stem) else table, path)
    if (path.parent / "manifest.json").is_file():  # a run's own table: recorded, as RunDir records what it writes
        from circuitstat.core.run_check import record_tables

        record_tables(path.parent, [path])


def _edge_stats(effect: np.ndarray, names: list[str], methods, second: int, rng) -> dict:
    E = len(effect)
    stats: dict[str, list] = {k: [] for k in ("method", "edge", "name", "estimate", "se", "ci_low", "ci_high", "p", "q",
                                              "n", "ci_method", "estimand", "tail_share", "no_tail_seen")}
    for j, m in enumerate(methods):
        est = effect * (1 + 0.1 * j) + rng.standard_normal(E) * 0.01 * j
        se = 0.05 + 0.02 * rng.random(E)
        lo, hi = est - 1.96 * se, est + 1.96 * se
        p = np.clip(np.exp(-np.abs(est / se)), 1e-12, 1)
        q = np.minimum(p * E / (np.argsort(np.argsort(p)) + 1), 1)
        if m == "exact":
            est[second], lo[second], hi[second], q[second] = KNOWN["estimate"], KNOWN["ci_low"], KNOWN["ci_high"], KNOWN["q"]
        reliable = np.ones(E, dtype=bool)
        reliable[np.argsort(-np.abs(effect))[2]] = False  # the third largest edge rests on a few prompts
        for k, v in (("method", [m] * E), ("edge", range(E)), ("name", names), ("estimate", est), ("se", se),
                     ("ci_low", lo), ("ci_high", hi), ("p", p), ("q", q), ("n", [64] * E),
                     ("ci_method", ["studentized_symmetric"] * E),
                     ("estimand", ["mean effect over the task's prompt distribution"] * E),
                     ("tail_share", np.where(reliable, 0.3, 0.8)), ("no_tail_seen", reliable)):
            stats[k] += list(v)
    return stats


def _stability(effect: np.ndarray, names: list[str], methods, rng) -> tuple[dict, dict, dict]:
    E = len(effect)
    order = np.argsort(-np.abs(effect))
    inc: dict[str, list] = {k: [] for k in ("method", "k", "edge", "name", "frequency")}
    stab: dict[str, list] = {k: [] for k in (
        "method", "k", "jaccard_mean", "jaccard_sd", "jaccard_ci_low", "jaccard_ci_high", "jaccard_chance",
        "jaccard_corrected", "phi", "phi_ci_low", "phi_ci_high", "consensus_size", "consensus_jaccard_mean",
        "jaccard_half", "jaccard_half_ci_low", "jaccard_half_ci_high",
        "jaccard_data", "jaccard_data_ci_low", "jaccard_data_ci_high", "jaccard_pop", "jaccard_pop_ci_low",
        "jaccard_pop_ci_high", "phi_data", "phi_data_ci_low", "phi_data_ci_high", "cutoff_ties_mean")}
    faith: dict[str, list] = {k: [] for k in (
        "method", "k", "edge_fraction", "f_ratio", "f_mean", "f_ci_low", "f_ci_high", "cpr", "cmd", "f_selected",
        "f_selected_ci_low", "f_selected_ci_high", "f_selected_note", "f_selected_estimand", "f_ci_estimand")}
    for j, m in enumerate(methods):
        for k in KS:
            cand = order[: min(2 * k, E)]
            freq = np.clip(1.0 - np.arange(cand.size) / (1.5 * k) + rng.normal(0, 0.03, cand.size), 0, 1)
            for c, v in (("method", [m] * cand.size), ("k", [k] * cand.size), ("edge", cand), ("name", [names[i] for i in cand]),
                         ("frequency", freq)):
                inc[c] += list(v)
            jm, ch = 0.95 - 0.004 * k - 0.2 * j, k / E
            for c, v in (("method", m), ("k", k), ("jaccard_mean", jm), ("jaccard_sd", 0.05), ("jaccard_ci_low", jm - 0.01),
                         ("jaccard_ci_high", jm + 0.01), ("jaccard_chance", ch), ("jaccard_corrected", (jm - ch) / (1 - ch)),
                         ("phi", jm - 0.02), ("phi_ci_low", jm - 0.03), ("phi_ci_high", jm), ("consensus_size", int((freq >= 0.5).sum())),
                         ("consensus_jaccard_mean", jm + 0.02), ("jaccard_half", jm - 0.04),
                         ("jaccard_half_ci_low", jm - 0.1), ("jaccard_half_ci_high", min(jm + 0.02, 1.0)),
                         ("jaccard_data", jm - 0.01), ("jaccard_data_ci_low", jm - 0.12),
                         ("jaccard_data_ci_high", min(jm + 0.04, 1.0)), ("jaccard_pop", jm), ("jaccard_pop_ci_low", jm - 0.1),
                         ("jaccard_pop_ci_high", min(jm + 0.05, 1.0)), ("phi_data", jm - 0.03), ("phi_data_ci_low", jm - 0.15),
                         ("phi_data_ci_high", jm + 0.02), ("cutoff_ties_mean", 1.0)):
                stab[c].append(v)
            f = 1 - np.exp(-k / 20) - 0.05 * j
            fs = f - 0.03
            for c, v in (("method", m), ("k", k), ("edge_fraction", k / E), ("f_ratio", f + 0.01), ("f_mean", f),
                         ("f_ci_low", f - 0.04), ("f_ci_high", f + 0.05), ("cpr", 0.71 - 0.1 * j), ("cmd", 0.29 + 0.1 * j),
                         ("f_selected", fs), ("f_selected_ci_low", fs - 0.08), ("f_selected_ci_high", fs + 0.07),
                         ("f_selected_note", "5-fold cross-fitting, 2 repeats"),
                         ("f_selected_estimand", "faithfulness of the top-k circuit selected from N prompts"),
                         ("f_ci_estimand", "faithfulness of this fixed circuit (selection not included)")):
                faith[c].append(v)
    return inc, stab, faith


def _approximation(effect: np.ndarray, names: list[str], methods, rng) -> tuple[dict, dict]:
    E = len(effect)
    approx: dict[str, list] = {k: [] for k in ("method", "edge", "name", "exact_mean", "approx_mean", "bias", "error_sd",
                                               "slope", "intercept", "r2")}
    summ: dict[str, list] = {k: [] for k in ("method", "spearman", "kendall", "slope", "r2", "bias_mean", "top_k_overlap", "k",
                                             "spearman_ci_low", "spearman_ci_high", "r2_ci_low", "r2_ci_high")}
    for m in [m for m in methods if m != "exact"]:
        a = 0.8 * effect + rng.normal(0, 0.05, E)
        for c, v in (("method", [m] * E), ("edge", range(E)), ("name", names), ("exact_mean", effect), ("approx_mean", a),
                     ("bias", a - effect), ("error_sd", 0.1 + 0.05 * rng.random(E)), ("slope", 0.8 + 0.1 * rng.standard_normal(E)),
                     ("intercept", 0.01 * rng.standard_normal(E)), ("r2", rng.random(E))):
            approx[c] += list(v)
        for c, v in (("method", m), ("spearman", 0.912), ("kendall", 0.7654), ("slope", 0.8123), ("r2", 0.9345),
                     ("bias_mean", -0.01), ("top_k_overlap", 0.85), ("k", 20), ("spearman_ci_low", 0.861),
                     ("spearman_ci_high", 0.948), ("r2_ci_low", 0.902), ("r2_ci_high", 0.961)):
            summ[c].append(v)
    return approx, summ


def _heads(n_layers: int, n_heads: int, rng) -> tuple[dict, dict, dict]:
    heads: dict[str, list] = {k: [] for k in ("layer", "head", "stability", "ci_low", "ci_high", "null_mean", "distinctness",
                                              "importance", "match", "pairs", "excess", "refit_ci_low", "refit_ci_high",
                                              "excess_ci_low", "excess_ci_high", "n_refits")}
    for layer in range(n_layers):
        for h in range(n_heads):
            s = float(np.clip(0.5 + 0.4 * rng.random(), 0, 1))
            for c, v in (("layer", layer), ("head", h), ("stability", s), ("ci_low", s - 0.1), ("ci_high", min(s + 0.08, 1)),
                         ("null_mean", 0.3), ("distinctness", 0.4 + 0.1 * h), ("importance", float("nan") if h == 0 else 0.1 * h),
                         ("match", "max"), ("pairs", "anchor"), ("excess", s - 0.3), ("refit_ci_low", s - 0.12),
                         ("refit_ci_high", min(s + 0.1, 1)), ("excess_ci_low", s - 0.3 - 0.12), ("excess_ci_high", s - 0.3 + 0.1),
                         ("n_refits", 5)):
                heads[c].append(v)
    stab = [0.61, 0.84][:n_layers] + [0.7] * max(0, n_layers - 2)
    layers = {"layer": list(range(n_layers)), "stability": stab, "ci_low": [0.5] * n_layers, "ci_high": [0.9] * n_layers,
              "null_mean": [0.32] * n_layers, "stability_all_anchors": [s - 0.01 for s in stab],
              "refit_ci_low": [s - 0.1 for s in stab], "refit_ci_high": [s + 0.08 for s in stab],
              "excess": [s - 0.33 for s in stab], "excess_ci_low": [s - 0.43 for s in stab],
              "excess_ci_high": [s - 0.25 for s in stab], "n_refits": [5] * n_layers}
    res: dict[str, list] = {k: [] for k in ("layer", "hook", "kind", "cka", "ci_low", "ci_high", "interval_reliable")}
    for layer in range(n_layers):
        for kind in ("linear", "rbf", "debiased"):
            v = 0.9 - 0.1 * layer - (0.05 if kind == "debiased" else 0)
            for c, x in (("layer", layer), ("hook", "pre-attention"), ("kind", kind), ("cka", v), ("ci_low", v - 0.05),
                         ("ci_high", v + 0.04), ("interval_reliable", kind == "debiased")):
                res[c].append(x)
    return heads, layers, res


def _variance(run: Path, names: list[str], order: np.ndarray, variance_edges: int, rng) -> None:
    sources = ["example", "counterfactual", "estimator", "seed", "residual"]
    sel = order[:variance_edges]
    sh = rng.dirichlet(np.ones(len(sources)), size=sel.size)
    write_filled({"edge": np.repeat(sel, len(sources)), "name": [names[e] for e in sel for _ in sources],
                  "source": sources * sel.size, "variance": (sh * 0.5).ravel(), "share": sh.ravel()},
                 run / "variance_components.parquet")
    write_filled({"factor": ["dataset", "counterfactual", "estimator", "aggregation", "seed"],
                  "jaccard_to_reference": [0.91, 0.72, 0.55, 0.88, 0.643], "ci_low": [0.85, 0.6, 0.41, 0.8, 0.5432],
                  "ci_high": [0.95, 0.8, 0.66, 0.93, 0.75], "bar": [0.8] * 5, "meets_bar": [True, False, False, True, False],
                  "verdict": ["met", "inconclusive", "not met", "met", "inconclusive"], "k": [20] * 5},
                 run / "variance_summary.parquet")


def make_report_run(root: Path, n_layers: int = 2, n_heads: int = 4, methods=("exact", "eap"), evil: bool = True,
                    seed: int = 0, variance_edges: int = 30, variance: bool = True) -> Path:
    """Write a synthetic run at ``root / "run"`` and return it (the demo's tables; a variance study's with `variance`)."""
    rng = np.random.default_rng(seed)
    run = root / "run"
    spec = {"models": ["zoo:attn2l/seed-0", "zoo:attn2l/seed-1", "zoo:attn2l/seed-2"], "task": {"name": "induction", "n": 64},
            "methods": list(methods), "n": 64, "seed": 7, "ranking": "absolute", "bootstrap": {"confidence_level": 0.95}}
    with RunDir(run, spec=spec, seed=7):
        pass
    edges = graph_edges(n_layers, n_heads)
    E = len(edges["index"])
    names = list(edges["name"])
    effect = np.clip(0.4 * rng.standard_normal(E), -1, 1) * np.exp(-np.arange(E) / 20.0)[rng.permutation(E)]
    top0, second = (int(i) for i in np.argsort(-np.abs(effect))[:2])
    effect[top0] = KNOWN["estimate"] * 3  # the largest edge overall
    effect[second] = KNOWN["estimate"]  # the second largest
    if evil:
        names[second] = EVIL
    edges["name"] = names
    write_filled(edges, run / "edges.parquet")
    write_filled(_edge_stats(effect, names, methods, second, rng), run / "edge_stats.parquet")
    for name, table in zip(("inclusion", "stability_vs_k", "faithfulness_vs_k"), _stability(effect, names, methods, rng)):
        write_filled(table, run / f"{name}.parquet")
    approx, summ = _approximation(effect, names, methods, rng)
    if approx["method"]:
        write_filled(approx, run / "approximation.parquet")
        write_filled(summ, run / "approximation_summary.parquet")
    for name, table in zip(("heads", "layers", "residual"), _heads(n_layers, n_heads, rng)):
        write_filled(table, run / f"{name}.parquet")
    write_filled({"item": ["mean head stability", "mean head stability (every refit an anchor; jackknife over 3 refits)"],
                  "value": [0.872, 0.85], "ci_low": [0.83, 0.7], "ci_high": [0.9, 0.95], "verdict": ["", ""]},
                 run / "summary.parquet")
    if variance:
        _variance(run, names, np.argsort(-np.abs(effect)), variance_edges, rng)
    return run
