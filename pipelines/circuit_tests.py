"""Hypothesis tests of a circuit on a model (Shi et al., NeurIPS 2024; github.com/blei-lab/circuitry).

The audit's ``circuit_tests`` stage (spec key ``tests``) and the calibration on ground-truth models both
run here: choose the circuit (the top-k of an attribution method's mean scores on a *selection* half of
the prompts, or a given edge list), evaluate the per-prompt metric of every circuit the tests need with the
faithfulness engine (circuitstat.circuits.faithfulness) on the *testing* prompts only, and hand those
arrays to circuitstat.stats.circuit_tests. Choosing and testing on separate prompts keeps selection from
making the tests optimistic.

The evaluated circuits, as columns of one metric matrix (:class:`CircuitLayout`): the circuit, its complement
(the circuit's edges ablated, every other edge live), the circuit minus each of its edges, ``n_random`` inflated
circuits (the circuit plus a random input -> logits path with at least one new edge, the reference code's
``sample_inflated(1)``) and each of them minus one uniformly random newly added edge, ``n_random`` random connected
circuits of at least the circuit's size (unions of random input -> logits paths, ``sample_circuit``) and their
complements (circuitstat.stats.circuit_paths). The full model is the faithfulness engine's clean run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from circuitstat.core.errors import InputError
from circuitstat.core.seeds import as_seed_sequence, spawn_seeds
from circuitstat.stats import circuit_tests as T

__all__ = ["CircuitLayout", "layout_masks", "split_rows", "choose_circuit", "evaluate_layout", "run_tests",
           "result_tables", "circuit_tests_stage", "TEST_NAMES"]

TEST_NAMES = ("equivalence", "equivalence_tost", "independence", "minimality", "sufficiency", "partial_necessity")


@dataclass(frozen=True)
class CircuitLayout:
    """Which column of the metric matrix holds which circuit, and the edges behind them."""

    circuit: np.ndarray  # [E] bool
    masks: np.ndarray  # [C, E] bool, True = edge live
    circuit_edges: np.ndarray  # edge index of each "minus" column
    added_edges: np.ndarray  # the newly added edge knocked out of each inflated circuit ("inflated_minus" column)

    @property
    def n_random(self) -> int:
        """Return the number of random circuits (and of inflated circuits)."""
        return int(self.added_edges.size)

    def split(self, m: np.ndarray) -> dict[str, np.ndarray]:
        """Return the metric matrix [N, C] cut into its named parts."""
        K, R = self.circuit_edges.size, self.n_random
        cut = np.cumsum([2, K, R, R, R, R])
        return {"circuit": m[:, 0], "complement": m[:, 1], "minus": m[:, cut[0]:cut[1]],
                "inflated": m[:, cut[1]:cut[2]], "inflated_minus": m[:, cut[2]:cut[3]],
                "random": m[:, cut[3]:cut[4]], "random_complement": m[:, cut[4]:cut[5]]}


def layout_masks(circuit: np.ndarray, n_random: int, seed: Any, names: list[str]) -> CircuitLayout:
    """Return the masks every test needs for ``circuit`` [E] (edge ``names``), ``n_random`` inflated and random
    connected circuits drawn from ``seed`` (circuitstat.stats.circuit_paths)."""
    from circuitstat.stats.circuit_paths import path_graph, sample_circuit, sample_inflated

    circuit = np.asarray(circuit, dtype=bool)
    E, k = circuit.size, int(circuit.sum())
    if k < 1 or k >= E:
        raise InputError(f"the circuit has {k} of the graph's {E} edges; tests need at least one edge in it and one out")
    if len(names) != E:
        raise InputError(f"{len(names)} edge names for a circuit mask of {E} edges")
    g = path_graph(names)
    rng = np.random.default_rng(as_seed_sequence(seed))
    inflated = np.empty((n_random, E), dtype=bool)
    added = np.empty(n_random, dtype=np.int64)
    for j in range(n_random):
        inflated[j], new = sample_inflated(g, circuit, rng)
        added[j] = rng.choice(new)
    inflated_minus = inflated.copy()
    inflated_minus[np.arange(n_random), added] = False
    rand = np.stack([sample_circuit(g, k, rng) for _ in range(n_random)]) if n_random else np.zeros((0, E), bool)
    inside = np.flatnonzero(circuit)
    minus = np.repeat(circuit[None], k, axis=0)
    minus[np.arange(k), inside] = False
    masks = np.concatenate([circuit[None], ~circuit[None], minus, inflated, inflated_minus, rand, ~rand])
    return CircuitLayout(circuit, masks, inside, added)


def split_rows(n: int, groups: np.ndarray | None, seed: Any) -> tuple[np.ndarray, np.ndarray]:
    """Return (selection rows, testing rows): a random half each (whole groups, when the task has templates)."""
    from circuitstat.stats.folds import fold_split

    sel, test = fold_split(np.random.default_rng(as_seed_sequence(seed)), n, 2, groups)
    return sel, test


def choose_circuit(S: np.ndarray | None, cfg, names: list[str], *, ranking: str, groups, seed: Any
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Return (circuit mask, selection rows, testing rows, how it was chosen) from scores S [N, E] or cfg.edges."""
    from circuitstat.core.topk import topk_mask

    E = len(names)
    if cfg.edges is not None:
        index = {n: i for i, n in enumerate(names)}
        unknown = [e for e in cfg.edges if e not in index]
        if unknown:
            raise InputError(f"tests.edges names {unknown[0]!r}, not an edge of the model; edges look like "
                             f"{names[0]!r}")
        mask = np.zeros(E, dtype=bool)
        mask[[index[e] for e in cfg.edges]] = True
        n = 0 if S is None else S.shape[0]
        return mask, np.arange(0), np.arange(n), "given edges (chosen elsewhere): tested on every prompt"
    if cfg.k >= E:
        raise InputError(f"tests.k={cfg.k} is not below the graph's {E} edges; use a smaller k")
    split_seed, tie_seed = spawn_seeds(seed, 2)
    sel, test = split_rows(S.shape[0], groups, split_seed)
    mean = S[sel].astype(np.float64).sum(0) / sel.size
    mask = topk_mask(mean, cfg.k, ranking=ranking, seed=tie_seed)
    return mask, sel, test, f"top-{cfg.k} ({ranking}) of the mean scores on the selection half; tested on the other"


def evaluate_layout(model, task, layout: CircuitLayout, rows: np.ndarray, *, ablation, seed: int, batch_size: int,
                    max_rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Return (full model [N], every layout circuit [N, C]) per-prompt metrics on ``rows`` (the faithfulness engine)."""
    from circuitstat.circuits.faithfulness import faithfulness

    res = faithfulness(model, task, layout.masks, ablation=ablation, seed=seed, batch_size=batch_size,
                       max_rows=max_rows, progress=False, rows=rows)
    return res.m_clean.astype(np.float64), res.m_circuit.astype(np.float64)


def run_tests(full: np.ndarray, m: np.ndarray, layout: CircuitLayout, cfg, seed: Any) -> dict[str, Any]:
    """Return {test name: result} of the tests on per-prompt metrics (``m`` columns as ``layout`` says); the paper's
    equivalence and the TOST split ties by the same coin."""
    p = layout.split(m)
    eq_seed, perm_seed = spawn_seeds(seed, 2)
    return {
        "equivalence": T.equivalence_test(full, p["circuit"], margin=cfg.margin, random_state=eq_seed),
        "equivalence_tost": T.equivalence_tost(full, p["circuit"], margin=cfg.margin, random_state=eq_seed),
        "independence": T.independence_test(full, p["complement"], n_permutations=cfg.n_permutations,
                                            random_state=perm_seed),
        "minimality": T.minimality_test(p["circuit"], p["minus"], p["inflated"], p["inflated_minus"],
                                        quantile=cfg.quantile, correction=cfg.correction),
        "sufficiency": T.sufficiency_test(full, p["circuit"], p["random"], quantile=cfg.random_quantile),
        "partial_necessity": T.partial_necessity_test(full, p["complement"], p["random_complement"],
                                                      quantile=cfg.random_quantile),
    }


def _parameter(name: str, cfg) -> float:
    """Return the test's one tuning number: the margin, the minimality quantile, or the random-circuit quantile."""
    if name in ("equivalence", "equivalence_tost"):
        return float(cfg.margin)
    if name == "minimality":
        return float(cfg.quantile)
    if name in ("sufficiency", "partial_necessity") and cfg.random_quantile is not None:
        return float(cfg.random_quantile)
    return float("nan")


def dangling_edges(graph, circuit: np.ndarray) -> np.ndarray:
    """[E] bool: the circuit's edges on no input -> logits path inside it (those the EAP-IG prune removes)."""
    from circuitstat.circuits.circuit.graph_ops import prune_edges

    kept, _ = prune_edges(graph, np.asarray(circuit, dtype=bool))
    return np.asarray(circuit, dtype=bool) & ~kept


def result_tables(results: dict[str, Any], layout: CircuitLayout, names: list[str], cfg, *, method: str,
                  n_select: int, n_test: int, selection: str, split_seed: Any,
                  dangling: np.ndarray | None = None) -> dict[str, dict]:
    """Return the columns of ``circuit_tests`` (one row per test, its proportion with a Clopper-Pearson interval)
    and ``circuit_minimality`` (one row per edge);
    ``dangling`` [E]: the circuit's edges on no input -> logits path (dangling_edges; None: none known)."""
    from circuitstat.core.seeds import seed_record

    mini = results["minimality"]
    rows = {c: [] for c in ("test", "statistic", "statistic_low", "statistic_high", "pvalue", "null",
                            "rejection_means")}
    for name in TEST_NAMES:
        r = results[name]
        rows["test"].append(name)
        if name == "minimality":
            # the weakest edge's share of references it beats, with its interval, and the family's p-value (the
            # smallest adjusted one: minimality is rejected at alpha exactly when it is <= alpha)
            weakest = int(mini.statistic.min())
            low, high = T.clopper_pearson(weakest, layout.n_random)
            rows["statistic"].append(weakest / layout.n_random)
            rows["pvalue"].append(mini.pvalue_min)
        else:
            low, high = r.details.get("ci_low", float("nan")), r.details.get("ci_high", float("nan"))
            rows["statistic"].append(float(r.statistic))
            rows["pvalue"].append(float(r.pvalue))
        rows["statistic_low"].append(float(low))
        rows["statistic_high"].append(float(high))
        rows["null"].append(r.null)
        rows["rejection_means"].append(r.rejection_means)
    n = len(TEST_NAMES)
    tests = {"method": [method] * n, **rows, "parameter": np.asarray([_parameter(t, cfg) for t in TEST_NAMES]),
             "k": np.full(n, int(layout.circuit.sum()), dtype=np.int64),
             "n_random": np.full(n, layout.n_random, dtype=np.int64),
             "n_test": np.full(n, n_test, dtype=np.int64), "n_select": np.full(n, n_select, dtype=np.int64),
             "correction": [cfg.correction] * n, "selection": [selection] * n,
             "split_seed": [json.dumps(seed_record(split_seed))] * n}
    K = layout.circuit_edges.size
    minimal = {"method": [method] * K, "edge": layout.circuit_edges.astype(np.int64),
               "name": [names[i] for i in layout.circuit_edges], "effect": mini.edge_effect,
               "count": mini.statistic, "pvalue": mini.pvalue, "pvalue_adjusted": mini.pvalue_adjusted,
               "correction": [cfg.correction] * K, "quantile": np.full(K, cfg.quantile),
               "n_random": np.full(K, layout.n_random, dtype=np.int64),
               "dangling": (np.zeros(K, dtype=bool) if dangling is None
                            else np.asarray(dangling, dtype=bool)[layout.circuit_edges])}
    return {"circuit_tests": tests, "circuit_minimality": minimal}


def circuit_tests_stage(model, task, scores: dict[str, np.ndarray], names: list[str], spec, seed: Any,
                        ablation: Any) -> dict[str, dict]:
    """Return the stage's two tables for the audit ``spec`` (its ``tests`` section) from the methods' scores."""
    cfg = spec.tests
    method = cfg.method or next(iter(scores))  # the first method with per-example scores
    choose_seed, layout_seed, test_seed = spawn_seeds(seed, 3)
    groups = None if task.group is None else task.group.numpy()
    S = scores[method]
    mask, sel, test, how = choose_circuit(S, cfg, names, ranking=spec.ranking, groups=groups, seed=choose_seed)
    layout = layout_masks(mask, cfg.n_random, layout_seed, names)
    full, m = evaluate_layout(model, task, layout, test, ablation=ablation, seed=spec.seed,
                              batch_size=spec.batch_size)
    results = run_tests(full, m, layout, cfg, test_seed)
    return result_tables(results, layout, names, cfg, method=method if cfg.edges is None else "given",
                         n_select=int(sel.size), n_test=int(test.size), selection=how, split_seed=choose_seed,
                         dangling=dangling_edges(model.graph, mask))
