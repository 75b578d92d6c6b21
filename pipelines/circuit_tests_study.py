"""Calibration of the circuit hypothesis tests on a ground-truth model: type-I error and power against N.

The planted (or tracr) model's per-prompt metrics are evaluated once on a pool of prompts for three circuits
(the true circuit; the true circuit plus an inert null edge, whose effect is exactly zero on every prompt;
the true circuit plus a null edge with per-prompt effects of mean zero), each with its complement, minus-edge,
plus-random-edge and random-circuit columns (circuitstat.pipelines.circuit_tests). Datasets are then resamples
of the pool (circuitstat.stats.circuit_tests_calibration), so R >= 200 datasets per N cost seconds.

``python -m circuitstat.pipelines.circuit_tests_study --out FILE.json`` runs the study docs/hypothesis-tests.md
records.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from circuitstat.core.seeds import spawn_seeds
from circuitstat.pipelines.circuit_tests import evaluate_layout, layout_masks
from circuitstat.stats import circuit_tests_calibration as C

__all__ = ["evaluation_pool", "calibration_rows", "main"]


def evaluation_pool(gt, n_pool: int, n_random: int, seed: int, batch_size: int = 16) -> dict[str, Any]:
    """Return the pool: the full model's metric and, per circuit label, the layout's metric parts on ``n_pool`` prompts."""
    task = gt.task(n_pool, seed)
    rng = np.random.default_rng(seed)
    inert = gt.null_edges & ~(gt.per_example_nulls if gt.per_example_nulls is not None else False)
    circuits = {"truth": gt.truth.copy()}
    if inert.any():
        circuits["plus_inert"] = gt.truth | (np.arange(gt.truth.size) == rng.choice(np.flatnonzero(inert)))
    if gt.per_example_nulls is not None and gt.per_example_nulls.any():
        pick = rng.choice(np.flatnonzero(gt.per_example_nulls))
        circuits["plus_null"] = gt.truth | (np.arange(gt.truth.size) == pick)
    rows = np.arange(n_pool)
    pool: dict[str, Any] = {"n_pool": n_pool, "n_random": n_random, "model": gt.name}
    for (label, mask), s in zip(circuits.items(), spawn_seeds(seed, len(circuits))):
        lay = layout_masks(mask, n_random, s)
        full, m = evaluate_layout(gt.model, task, lay, rows, ablation="counterfactual", seed=seed,
                                  batch_size=batch_size, max_rows=256)
        pool["full"] = full
        pool[label] = lay.split(m)
        pool[label + "_edges"] = [gt.model.graph.edge_names[i] for i in lay.circuit_edges]
    return pool


def _row(scenario: str, test: str, kind: str, n: int, hits: np.ndarray, **extra: Any) -> dict[str, Any]:
    rate, se = C.rejection_rate(hits)
    return {"scenario": scenario, "test": test, "kind": kind, "n": n, "R": int(hits.size), "rate": rate,
            "mc_se": se, "low": max(0.0, rate - 2 * se), "high": min(1.0, rate + 2 * se), **extra}


def _equivalence_rows(pool: dict, n: int, R: int, alpha: float, seed: int) -> list[dict]:
    full, truth = pool["full"], pool["truth"]
    q, boundary = C.boundary_margin(full, truth["circuit"])
    out = [_row("truth, margin at the pool's boundary |q - 1/2|", "equivalence", "type-I", n,
                C.simulate_equivalence(full, truth["circuit"], n, R, margin=boundary, alpha=alpha, seed=seed),
                exact_size=C.equivalence_size(n, q, boundary, alpha), q=q, margin=boundary),
           _row("truth, margin 0.1", "equivalence", "type-I", n,
                C.simulate_equivalence(full, truth["circuit"], n, R, margin=0.1, alpha=alpha, seed=seed + 1),
                exact_size=C.equivalence_size(n, q, 0.1, alpha), q=q, margin=0.1)]
    for j, edge in enumerate(pool["truth_edges"]):  # power per removed true edge (the worst edge is the bar)
        minus = truth["minus"][:, j]
        qj, _ = C.boundary_margin(full, minus)
        out.append(_row(f"truth minus {edge}, margin 0.1", "equivalence", "power", n,
                        C.simulate_equivalence(full, minus, n, R, margin=0.1, alpha=alpha, seed=seed + 2 + j),
                        exact_size=C.equivalence_size(n, qj, 0.1, alpha), q=qj, margin=0.1))
    return out


def _random_rows(pool: dict, n: int, R: int, alpha: float, n_random: int, seed: int) -> list[dict]:
    full, t = pool["full"], pool["truth"]
    size = C.rank_size(n_random, alpha)
    return [
        _row("a random circuit against random circuits of its size", "sufficiency", "type-I", n,
             C.simulate_random_rank(full, t["circuit"], t["random"], n, R, n_random=n_random, alpha=alpha,
                                    seed=seed, exchangeable=True), exact_size=size),
        _row("truth", "sufficiency", "power", n,
             C.simulate_random_rank(full, t["circuit"], t["random"], n, R, n_random=n_random, alpha=alpha,
                                    seed=seed + 1)),
        _row("a random circuit's complement against random complements", "partial_necessity", "type-I", n,
             C.simulate_random_rank(full, t["complement"], t["random_complement"], n, R, n_random=n_random,
                                    alpha=alpha, seed=seed + 2, test="partial_necessity", exchangeable=True),
             exact_size=size),
        _row("truth", "partial_necessity", "power", n,
             C.simulate_random_rank(full, t["complement"], t["random_complement"], n, R, n_random=n_random,
                                    alpha=alpha, seed=seed + 3, test="partial_necessity")),
    ]


def _other_rows(pool: dict, n: int, R: int, alpha: float, n_random: int, n_perm: int, seed: int) -> list[dict]:
    full = pool["full"]
    out = []
    for label, kind in (("truth", "type-I"), ("plus_inert", "power"), ("plus_null", "power")):
        if label not in pool:
            continue
        p = pool[label]
        for corr in ("holm", "bh"):
            out.append(_row({"truth": "truth", "plus_inert": "truth plus an inert null edge",
                             "plus_null": "truth plus a per-prompt null edge (mean effect 0)"}[label],
                            f"minimality ({corr})", kind, n,
                            C.simulate_minimality(p["circuit"], p["minus"], p["plus"], n, R, n_random=n_random,
                                                  quantile=0.9, alpha=alpha, correction=corr, seed=seed)))
    t = pool["truth"]
    out.append(_row("full model against another prompt's complement", "independence", "type-I", n,
                    C.simulate_independence(full, t["complement"], n, R, n_permutations=n_perm, alpha=alpha,
                                            seed=seed + 1, independent=True), exact_size=alpha))
    out.append(_row("truth's complement", "independence", "rejection", n,
                    C.simulate_independence(full, t["complement"], n, R, n_permutations=n_perm, alpha=alpha,
                                            seed=seed + 2)))
    return out


def calibration_rows(pool: dict, sizes: list[int], R: int, *, alpha: float = 0.05, n_random: int = 39,
                     n_permutations: int = 199, seed: int = 0) -> list[dict]:
    """Return one row per (scenario, test, N): rejection rate over R datasets with its MC SE and, where known, exact size."""
    rows: list[dict] = []
    for i, n in enumerate(sizes):
        s = seed + 1000 * i
        rows += _equivalence_rows(pool, n, R, alpha, s)
        rows += _random_rows(pool, n, R, alpha, n_random, s + 100)
        rows += _other_rows(pool, n, R, alpha, n_random, n_permutations, s + 200)
    return rows


def markdown(rows: list[dict]) -> str:
    """Return the rows as one markdown table per test: rate ± 2 MC SE (and the exact size, where known) per N."""
    sizes = sorted({r["n"] for r in rows})
    out = []
    for test in dict.fromkeys(r["test"] for r in rows):
        out += [f"**{test}**", "", "| scenario | kind | " + " | ".join(f"N = {n}" for n in sizes) + " |",
                "|---|---|" + "---|" * len(sizes)]
        for scenario in dict.fromkeys(r["scenario"] for r in rows if r["test"] == test):
            cells = []
            for n in sizes:
                (r,) = [r for r in rows if r["test"] == test and r["scenario"] == scenario and r["n"] == n]
                exact = f" (exact {r['exact_size']:.3f})" if r.get("exact_size") is not None else ""
                cells.append(f"{r['rate']:.3f} ± {2 * r['mc_se']:.3f}{exact}")
            kind = next(r["kind"] for r in rows if r["test"] == test and r["scenario"] == scenario)
            out.append(f"| {scenario} | {kind} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """Run the calibration study and write its rows (JSON) to --out."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="planted:induction?background=0.3")
    ap.add_argument("--pool", type=int, default=1024)
    ap.add_argument("--pool-random", type=int, default=100)
    ap.add_argument("--sizes", default="8,16,32,64,128,256")
    ap.add_argument("--R", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from circuitstat.circuits.groundtruth import load_groundtruth

    gt = load_groundtruth(a.model)
    pool = evaluation_pool(gt, a.pool, a.pool_random, a.seed)
    print(f"pool of {a.pool} prompts evaluated", file=sys.stderr, flush=True)
    rows = calibration_rows(pool, [int(s) for s in a.sizes.split(",")], a.R, seed=a.seed)
    with open(a.out, "w") as f:
        json.dump({"model": a.model, "pool": a.pool, "pool_random": a.pool_random, "R": a.R, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
