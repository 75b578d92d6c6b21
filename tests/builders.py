"""Run builders shared by the tests: synthetic run directories with the audit's tables.

Columns a builder does not set are filled from core/schema.py, so a builder cannot drift from
what the audit writes (a column the schema does not know raises). Importable from any test
(tests/conftest.py puts this folder on the path) and as the ``audit_run`` fixture.
"""

from __future__ import annotations

from pathlib import Path

from circuitstat.core.rundir import RunDir
from circuitstat.core.schema import fill
from circuitstat.core.tables import write_table

# GPT-2 small's 12 layers of 12 heads with a tiny width (every head a paper names exists); initializer_range 1: logits
# far from uniform, so a probability-difference metric moves (greater-than). The catalogue's random-weight stand-in.
GPT2_SHAPED = "random:gpt2?n_layer=12&n_head=12&n_embd=24&n_positions=64&initializer_range=1.0&seed=0"
EDGES = ["input->a0.h0<q>", "input->a1.h5<k>", "a0.h3->a1.h5<k>", "a0.h1->a1.h2<v>", "a1.h5->logits", "a0.h3->logits"]


def audit_tables(methods=("exact", "eap"), ks=(5, 10, 20), heads=True, faithfulness=True, approximation=True,
                 verified=False, published=False, circuit_tests=False):
    """Return {table name: columns} of a small audit with known values (six edges, the given methods and k)."""
    n = len(EDGES)
    t = {
        "edges": {"index": list(range(n)), "name": EDGES, "sender": [e.split("->")[0] for e in EDGES],
                  "receiver": [e.split("->")[1] for e in EDGES], "sender_layer": [0] * n, "receiver_layer": [1] * n,
                  "kind": ["q", "k", "k", "v", "logits", "logits"]},
    }
    es = {c: [] for c in ["method", "edge", "name", "estimate", "se", "ci_low", "ci_high", "p", "q", "n",
                          "tail_share", "no_tail_seen"]}
    inc = {c: [] for c in ["method", "k", "edge", "name", "frequency"]}
    st = {c: [] for c in ["method", "k", "jaccard_mean", "jaccard_sd", "jaccard_ci_low", "jaccard_ci_high", "jaccard_chance",
                          "jaccard_corrected", "phi", "phi_ci_low", "phi_ci_high", "consensus_size", "consensus_jaccard_mean",
                          "jaccard_data", "jaccard_data_ci_low", "jaccard_data_ci_high", "jaccard_pop_ci_low",
                          "phi_data", "phi_data_ci_low"]}
    fa = {c: [] for c in ["method", "k", "edge_fraction", "f_ratio", "f_mean", "f_ci_low", "f_ci_high", "cpr", "cmd",
                          "f_selected", "f_selected_ci_low", "f_selected_ci_high", "f_selected_note"]}
    ap = {c: [] for c in ["method", "spearman", "kendall", "slope", "r2", "bias_mean", "top_k_overlap", "k"]}
    for m in methods:
        for i, e in enumerate(EDGES):
            est = [2.0, -0.5, 1.5, 0.01, 0.8, -0.02][i]
            es["method"].append(m), es["edge"].append(i), es["name"].append(e), es["estimate"].append(est)
            es["se"].append(0.1), es["ci_low"].append(est - 0.2), es["ci_high"].append(est + 0.2)
            es["p"].append(0.001 if abs(est) > 0.1 else 0.6), es["q"].append(0.004 if abs(est) > 0.1 else 0.7)
            es["n"].append(32)
            # a1.h5->logits (edge 4) rests on a few prompts: no_tail_seen is false
            es["tail_share"].append(0.8 if i == 4 else 0.3), es["no_tail_seen"].append(i != 4)
        for k in ks:
            for i, e in enumerate(EDGES):
                if i == 3:  # a0.h1->a1.h2<v> never selected: no row
                    continue
                inc["method"].append(m), inc["k"].append(k), inc["edge"].append(i), inc["name"].append(e)
                inc["frequency"].append(0.95 if i == 2 else 0.5)
            jm = {5: 0.7, 10: 0.8, 20: 0.85}.get(k, 0.9)
            for c, v in [("jaccard_mean", jm), ("jaccard_sd", 0.05), ("jaccard_ci_low", jm - 0.05), ("jaccard_ci_high", jm + 0.05),
                         ("jaccard_chance", 0.1), ("jaccard_corrected", (jm - 0.1) / 0.9), ("phi", jm - 0.02),
                         ("phi_ci_low", jm - 0.1), ("phi_ci_high", jm + 0.03), ("consensus_jaccard_mean", jm + 0.01),
                         ("jaccard_data", jm), ("jaccard_data_ci_low", jm - 0.2), ("jaccard_data_ci_high", jm + 0.1),
                         ("jaccard_pop_ci_low", jm - 0.25), ("phi_data", jm - 0.02), ("phi_data_ci_low", jm - 0.15)]:
                st[c].append(v)
            st["method"].append(m), st["k"].append(k), st["consensus_size"].append(k)
            fa["method"].append(m), fa["k"].append(k), fa["edge_fraction"].append(k / 100)
            for c, v in [("f_ratio", 0.9), ("f_mean", 0.85), ("f_ci_low", 0.75), ("f_ci_high", 0.95), ("cpr", 0.6), ("cmd", 0.3)]:
                fa[c].append(v)
            # selection-aware faithfulness: the lower bound reaches 0.8 at k >= 10 only (the verdict picks k = 10)
            fs, half = {5: (0.55, 0.15), 10: (0.86, 0.05), 20: (0.92, 0.04)}.get(k, (0.95, 0.03))
            for c, v in [("f_selected", fs), ("f_selected_ci_low", fs - half), ("f_selected_ci_high", fs + half),
                         ("f_selected_note", "5-fold cross-fitting, 2 repeats")]:
                fa[c].append(v)
        if approximation and m != "exact" and "exact" in methods:
            for k in ks:
                ap["method"].append(m), ap["k"].append(k)
                for c, v in [("spearman", 0.9), ("kendall", 0.75), ("slope", 0.95), ("r2", 0.8), ("bias_mean", 0.01),
                             ("top_k_overlap", 0.5 + k / 100)]:
                    ap[c].append(v)
    t.update(edge_stats=es, inclusion=inc, stability_vs_k=st)
    if faithfulness:
        t["faithfulness_vs_k"] = fa
    if approximation and ap["method"]:
        t["approximation_summary"] = ap
    if heads:
        hs = {c: [] for c in ["layer", "head", "stability", "ci_low", "ci_high", "null_mean", "distinctness", "importance", "match",
                              "pairs", "excess", "excess_ci_low", "excess_ci_high", "refit_ci_low", "refit_ci_high", "n_refits"]}
        for layer in range(2):
            for h in range(8):
                s = 0.95 if (layer, h) == (1, 5) else 0.4
                for c, v in [("layer", layer), ("head", h), ("stability", s), ("ci_low", s - 0.05), ("ci_high", s + 0.03),
                             ("null_mean", 0.2), ("distinctness", 0.3), ("importance", 1.1), ("match", "max"), ("pairs", "anchor"),
                             ("excess", s - 0.2), ("excess_ci_low", s - 0.2 - 0.1), ("excess_ci_high", s - 0.2 + 0.08),
                             ("refit_ci_low", s - 0.1), ("refit_ci_high", s + 0.05), ("n_refits", 5)]:
                    hs[c].append(v)
        t["heads"] = hs
        t["layers"] = {"layer": [0, 1], "stability": [0.4, 0.47], "ci_low": [0.35, 0.42], "ci_high": [0.45, 0.52],
                       "null_mean": [0.2, 0.2], "stability_all_anchors": [0.41, 0.46], "refit_ci_low": [0.3, 0.38],
                       "refit_ci_high": [0.5, 0.55], "excess": [0.21, 0.26], "excess_ci_low": [0.1, 0.18],
                       "excess_ci_high": [0.3, 0.35], "n_refits": [5, 5]}
    if verified:  # a verified eap run (spec key verify) with an edge subset: every edge but the last verified
        n_v = len(EDGES) - 1
        t["verified"] = {"method": ["eap"] * n_v, "edge": list(range(n_v)), "edge_name": EDGES[:n_v],
                         "estimate": [0.0, -0.4, 1.2, 0.3, 0.8], "ci_low": [-0.1, -0.6, 0.9, -0.2, 0.5],
                         "ci_high": [0.1, -0.2, 1.5, 0.8, 1.1], "qvalue": [0.9, 0.01, 0.001, 0.4, 0.02],
                         "no_tail_seen": [True] * n_v, "n_labelled": [16] * n_v, "n_prompts": [512] * n_v,
                         "estimand": ["mean exact effect, verified on 16 of 512 prompts"] * n_v}
        t["missed_edges"] = {"method": ["eap"], "tau": [0.1], "n_top": [2], "n_remaining": [4], "n_sampled": [3],
                             "n_unverified": [1], "sampled_above": [1], "missed_low": [0], "missed_high": [1],
                             "remaining_above_high": [2], "level": [0.95],
                             "estimand": ["number of unverified edges whose mean exact effect exceeds the threshold"]}
    if published:  # a published circuit of four edges audited on this run (spec key circuit)
        m = list(methods)
        t["published_circuit"] = {"method": m, "circuit": ["circuit.json"] * len(m), "n_edges": [4] * len(m),
                                  "f_ratio": [0.8] * len(m), "f_ci_low": [0.7] * len(m), "f_ci_high": [0.9] * len(m),
                                  "cpr": [0.6] * len(m), "cmd": [0.3] * len(m), "q_level": [0.05] * len(m),
                                  "n_unsupported": [1] * len(m), "share_unsupported": [0.25] * len(m),
                                  "inclusion_mean": [0.7] * len(m), "inclusion_min": [0.4] * len(m)}
        # its edges: input->a1.h5<k>, a0.h3->a1.h5<k>, a0.h1->a1.h2<v> (q 0.7: the one unsupported edge, never
        # selected) and a1.h5->logits (whose mean a few prompts carry); estimates, intervals and q from edge_stats
        pce = {c: [] for c in ("method", "edge", "name", "estimate", "ci_low", "ci_high", "q", "supported", "inclusion")}
        for j, method in enumerate(m):
            for i in (1, 2, 3, 4):
                row = j * len(EDGES) + i  # edge_stats holds one row per method and edge, in that order
                for c in ("estimate", "ci_low", "ci_high", "q"):
                    pce[c].append(es[c][row])
                pce["method"].append(method), pce["edge"].append(i), pce["name"].append(EDGES[i])
                pce["supported"].append(es["q"][row] <= 0.05)
                pce["inclusion"].append({2: 0.95, 3: 0.0}.get(i, 0.5))
        t["published_circuit_edges"] = pce
    if circuit_tests:
        tests = ["equivalence", "equivalence_tost", "independence", "minimality", "sufficiency", "partial_necessity"]
        t["circuit_tests"] = {"method": ["exact"] * 6, "test": tests,
                              "statistic": [0.55, 0.55, 0.01, 0.9, 1.0, 0.95],
                              "pvalue": [0.6, 0.01, 0.3, 0.8, 0.02, 0.04], "k": [3] * 6, "n_random": [49] * 6,
                              "n_test": [32] * 6, "n_select": [32] * 6, "correction": ["holm"] * 6,
                              "null": ["H0"] * 6, "rejection_means": ["H0 is false"] * 6}
        t["circuit_minimality"] = {"method": ["exact"] * 3, "edge": [2, 4, 5], "name": [EDGES[i] for i in (2, 4, 5)],
                                   "effect": [1.0, 2.0, 0.5], "count": [45, 49, 44], "pvalue": [0.6, 1.0, 0.4],
                                   "pvalue_adjusted": [0.8, 1.0, 0.8], "correction": ["holm"] * 3,
                                   "quantile": [0.9] * 3, "n_random": [49] * 3}
    return t


def make_run(path: Path, manifest: bool = True, **kw) -> Path:
    """A synthetic run directory with the audit's tables (with a manifest through RunDir, or bare).

    Columns the fixture does not set are filled from core/schema.py, so the fixture cannot drift
    from what the audit writes (a column the schema does not know raises)."""
    tables = {name: fill(name, t, len(next(iter(t.values())))) for name, t in audit_tables(**kw).items()}
    if manifest:
        with RunDir(path, spec={"synthetic": True}, seed=0) as run:
            for name, t in tables.items():
                run.write_table(name, t)
    else:
        path.mkdir(parents=True, exist_ok=True)
        for name, t in tables.items():
            write_table(t, path / f"{name}.parquet")
    return path


def small_mask_audit_spec(methods: list[str], **sections: dict) -> dict:
    """A 2-layer random GPT-2 induction audit small enough for a mask fit in seconds, running ``methods`` with the
    given method sections (e.g. ``edge_pruning={...}``); shared by the mask-method audit and report tests."""
    return {"model": "random:gpt2?n_layer=2&n_head=2&n_embd=32&vocab_size=128&n_positions=64&seed=3",
            "task": {"name": "induction", "n": 12, "options": {"seq_len": 5}}, "methods": list(methods),
            "batch_size": 6, "bootstrap": {"n_resamples": 40}, "k": [3, 6], "k_search": 0, "seed": 5, **sections}
