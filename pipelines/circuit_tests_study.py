"""Calibration of the circuit hypothesis tests on a ground-truth model: type-I error and power against N.

The planted (or tracr) model's per-prompt metrics are evaluated once on a pool of prompts for three circuits
(the true circuit; the true circuit plus an inert null edge, whose effect is exactly zero on every prompt;
the true circuit plus a weak redundant path: the weakest background path input -> X -> logits, whose edges have
per-prompt effects of mean zero), each with its complement, minus-edge,
inflated-circuit and random-connected-circuit columns (circuitstat.pipelines.circuit_tests). Datasets are then resamples
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

from circuitstat.core.params import BATCH_SIZE, SEED
from circuitstat.core.seeds import spawn_seeds
from circuitstat.pipelines.circuit_tests import evaluate_layout, layout_masks
from circuitstat.stats import circuit_tests_calibration as C

__all__ = ["evaluation_pool", "calibration_rows", "main"]


def _weak_path(gt, task, n_pool: int, seed: int, batch_size: int) -> np.ndarray | None:
    """Return [E] bool: the weakest live background path input -> X -> logits (both edges per-prompt nulls, mean
    effect 0) as a redundant addition to the true circuit, or None when the model has none. Weakest: the smallest
    loss of knocking its X -> logits edge out of truth + path on the pool, above float rounding."""
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.stats.circuit_tests import float_tolerance

    if gt.per_example_nulls is None:
        return None
    names = list(gt.model.graph.edge_names)
    index = {n: i for i, n in enumerate(names)}
    paths = []
    for e in np.flatnonzero(gt.per_example_nulls):
        sender, receiver = names[e].split("->", 1)
        into = [index[n] for n in (f"input->{sender}", f"input->{sender}<v>") if n in index]
        if receiver == "logits" and sender != "input" and into and gt.per_example_nulls[into[0]]:
            paths.append((into[0], int(e)))
    if not paths:
        return None
    masks = []
    for a, b in paths:
        m = gt.truth.copy()
        m[[a, b]] = True
        masks += [m, m & (np.arange(m.size) != b)]
    res = faithfulness(gt.model, task, np.stack(masks), ablation="counterfactual", seed=seed, batch_size=batch_size,
                       max_rows=256, progress=False, rows=np.arange(n_pool))
    mc = res.m_circuit.astype(np.float64)
    loss = ((mc[:, 0::2] - mc[:, 1::2]) ** 2).mean(0)
    live = np.sqrt(loss) > float_tolerance(mc)
    if not live.any():
        return None
    a, b = paths[int(np.flatnonzero(live)[np.argmin(loss[live])])]
    return np.isin(np.arange(gt.truth.size), [a, b])


def evaluation_pool(gt, n_pool: int, n_random: int, seed: int,
                    batch_size: int = BATCH_SIZE.default) -> dict[str, Any]:
    """Return the pool: the full model's metric and, per circuit label, the layout's metric parts on ``n_pool`` prompts."""
    task = gt.task(n_pool, seed)
    rng = np.random.default_rng(seed)
    inert = gt.null_edges & ~(gt.per_example_nulls if gt.per_example_nulls is not None else False)
    idx = np.arange(gt.truth.size)
    circuits = {"truth": gt.truth.copy()}
    if inert.any():
        circuits["plus_inert"] = gt.truth | (np.arange(gt.truth.size) == rng.choice(np.flatnonzero(inert)))
    weak = _weak_path(gt, task, n_pool, seed, batch_size)
    if weak is not None:
        circuits["plus_null"] = gt.truth | weak
    rows = np.arange(n_pool)
    pool: dict[str, Any] = {"n_pool": n_pool, "n_random": n_random, "model": gt.name}
    for (label, mask), s in zip(circuits.items(), spawn_seeds(seed, len(circuits))):
        lay = layout_masks(mask, n_random, s, list(gt.model.graph.edge_names))
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
    out = []
    for tost, test in ((False, "equivalence"), (True, "equivalence (TOST)")):
        size = C.tost_size if tost else C.equivalence_size
        # at the pool's boundary |q - 1/2| both nulls hold (each includes its boundary); at margin 0.1 the paper's
        # null holds and the TOST's is false (the truth is equivalent: power)
        out.append(_row("truth, margin at the pool's boundary |q - 1/2|", test, "type-I", n,
                        C.simulate_equivalence(full, truth["circuit"], n, R, margin=boundary, alpha=alpha,
                                               seed=seed, tost=tost),
                        exact_size=size(n, q, boundary, alpha), q=q, margin=boundary))
        out.append(_row("truth, margin 0.1", test, "power" if tost else "type-I", n,
                        C.simulate_equivalence(full, truth["circuit"], n, R, margin=0.1, alpha=alpha, seed=seed + 1,
                                               tost=tost), exact_size=size(n, q, 0.1, alpha), q=q, margin=0.1))
        for j, edge in enumerate(pool["truth_edges"]):  # per removed true edge (the worst edge is the bar)
            minus = truth["minus"][:, j]
            qj, _ = C.boundary_margin(full, minus)
            out.append(_row(f"truth minus {edge}, margin 0.1", test, "type-I" if tost else "power", n,
                            C.simulate_equivalence(full, minus, n, R, margin=0.1, alpha=alpha, seed=seed + 2 + j,
                                                   tost=tost), exact_size=size(n, qj, 0.1, alpha), q=qj, margin=0.1))
    return out


def _random_rows(pool: dict, n: int, R: int, alpha: float, n_random: int, seed: int) -> list[dict]:
    full, t = pool["full"], pool["truth"]
    out = []
    for quantile, label in ((0.9, "q = 0.9"), (None, "exact rank")):
        size = {"exact_size": C.rank_size(n_random, alpha)} if quantile is None else {}
        for test, cand, rand, what in (("sufficiency", t["circuit"], t["random"], "a random connected circuit"),
                                       ("partial_necessity", t["complement"], t["random_complement"],
                                        "a random connected circuit's complement")):
            kw = dict(n_random=n_random, alpha=alpha, test=test, quantile=quantile)
            out.append(_row(f"{what} against random ones of its size", f"{test} ({label})", "type-I", n,
                            C.simulate_random_rank(full, cand, rand, n, R, seed=seed, exchangeable=True, **kw),
                            **size))
            out.append(_row("truth", f"{test} ({label})", "power", n,
                            C.simulate_random_rank(full, cand, rand, n, R, seed=seed + 1, **kw)))
            seed += 2
    return out


def _other_rows(pool: dict, n: int, R: int, alpha: float, n_random: int, n_perm: int, seed: int) -> list[dict]:
    full = pool["full"]
    out = []
    for label, kind in (("truth", "type-I"), ("plus_inert", "power"), ("plus_null", "power")):
        if label not in pool:
            continue
        p = pool[label]
        for corr in ("holm", "bh"):
            out.append(_row({"truth": "truth", "plus_inert": "truth plus an inert null edge",
                             "plus_null": "truth plus a weak redundant path (per-prompt effects, mean 0)"}[label],
                            f"minimality ({corr})", kind, n,
                            C.simulate_minimality(p["circuit"], p["minus"], p["inflated"], p["inflated_minus"], n, R,
                                                  n_random=n_random, quantile=0.9, alpha=alpha, correction=corr,
                                                  seed=seed)))
    t = pool["truth"]
    out.append(_row("full model against another prompt's complement", "independence", "type-I", n,
                    C.simulate_independence(full, t["complement"], n, R, n_permutations=n_perm, alpha=alpha,
                                            seed=seed + 1, independent=True), exact_size=alpha))
    out.append(_row("truth's complement", "independence", "rejection", n,
                    C.simulate_independence(full, t["complement"], n, R, n_permutations=n_perm, alpha=alpha,
                                            seed=seed + 2)))
    return out


def calibration_rows(pool: dict, sizes: list[int], R: int, *, alpha: float = 0.05, n_random: int = 39,
                     n_permutations: int = 199, seed: int = SEED.default) -> list[dict]:
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
    ap.add_argument("--n-random", type=int, default=None,
                    help="random (and inflated) circuits per dataset, drawn from the pool's --pool-random "
                         "(default: the spec's tests.n_random)")
    ap.add_argument("--seed", type=int, default=SEED.default)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.pipelines.spec import CircuitTestsSpec

    n_random = CircuitTestsSpec.model_fields["n_random"].default if a.n_random is None else a.n_random
    if n_random >= a.pool_random:  # each dataset draws its circuits from the pool's without replacement
        ap.error(f"--n-random {n_random} needs a larger pool: give --pool-random above it (e.g. {n_random + 28})")
    gt = load_groundtruth(a.model)
    pool = evaluation_pool(gt, a.pool, a.pool_random, a.seed)
    print(f"pool of {a.pool} prompts evaluated", file=sys.stderr, flush=True)
    rows = calibration_rows(pool, [int(s) for s in a.sizes.split(",")], a.R, seed=a.seed, n_random=n_random)
    with open(a.out, "w") as f:
        json.dump({"model": a.model, "pool": a.pool, "pool_random": a.pool_random, "n_random": n_random, "R": a.R,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
