"""Coverage of edge pruning's selection-aware faithfulness interval on a model with exact truth (a Monte Carlo
study, not a timing).

Per dataset r (``--datasets`` of them, each N fresh prompt pairs of the planted induction model's task, drawn
from seed r): edge pruning is fitted on the N prompts (its top-|C| circuit by mask logit is the circuit one
reports), and its selection-aware interval is cross-fitted with one refit per fold
(circuitstat.stats.faithfulness_refit via circuitstat.pipelines.runs.groundtruth.masks.fold_refit, as
``study groundtruth`` runs it).  The truth is that circuit's faithfulness on ``--pool`` fresh prompts (ratio of
means; its own standard error, from the linearised ratio, is recorded beside it).  Prints the share of
datasets whose interval covers it, with its Monte Carlo SE (per k of ``--k-multiples`` x |C|), and writes one JSON
line per dataset and k to ``--out``.

    OMP_NUM_THREADS=1 python bench/masks_coverage.py --datasets 50 --n 48 --steps 40 --jobs 2 --out cov.jsonl
"""

from __future__ import annotations

import argparse
import json
from multiprocessing import Pool

import numpy as np

SOURCE = "planted:induction?background=1"


def _ratio_and_se(mc: np.ndarray, mM: np.ndarray, m0: np.ndarray) -> tuple[float, float]:
    """Ratio of means of one circuit and its delta-method standard error."""
    den = mM - m0
    f = float((mc - m0).mean() / den.mean())
    u = ((mc - m0) - f * den) / den.mean()
    return f, float(u.std(ddof=1) / np.sqrt(u.size))


def one_dataset(args: tuple) -> dict:
    """The coverage record of dataset ``r``."""
    r, n, steps, lr, folds, pool, multiples = args
    import torch

    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.pipelines.runs.groundtruth.masks import fold_refit
    from circuitstat.stats.faithfulness_refit import refit_selection_faithfulness

    torch.set_num_threads(1)
    gt = load_groundtruth(SOURCE)
    task, fresh = gt.task(n, r), gt.task(pool, 10_000_000 + r)
    ks = [int(m * gt.truth.sum()) for m in multiples]
    opts = {"steps": steps, "lr": lr, "sparsity": 1.0, "init": 1.0}
    s_fit, s_sel = spawn_seeds(r, 2)
    full = fit_edge_pruning(gt.model, task, seed=s_fit, **opts).log_alpha

    def evaluate(masks, rows):
        res = faithfulness(gt.model, task, masks, rows=rows, progress=False)
        return res.m_circuit, res.m_clean, res.m_empty

    sel = refit_selection_faithfulness(fold_refit(gt.model, task, np.arange(n), **opts), full, evaluate, ks,
                                       n_obs=n, n_folds=folds, seed=s_sel)
    order = np.argsort(-full, kind="stable")
    selected = np.zeros((len(ks), gt.truth.size), dtype=bool)
    for i, k in enumerate(ks):
        selected[i, order[:k]] = True
    res = faithfulness(gt.model, fresh, np.vstack([selected, gt.truth[None]]), batch_size=256, progress=False)
    f_true, _ = _ratio_and_se(res.m_circuit[:, -1], res.m_clean, res.m_empty)
    ci = sel.conf_int().to_array()
    out = []
    for i, k in enumerate(ks):
        f_sel, se_sel = _ratio_and_se(res.m_circuit[:, i], res.m_clean, res.m_empty)
        lo, hi = float(ci[i, 0]), float(ci[i, 1])
        out.append({"dataset": r, "n": n, "k": k, "estimate": float(sel.estimate[i]), "lo": lo, "hi": hi,
                    "f_pop": f_sel, "f_pop_se": se_sel, "covers": lo <= f_sel <= hi,
                    "contains_truth": bool(selected[i, gt.truth].all()),
                    "selected_is_truth": bool((selected[i] == gt.truth).all()),
                    "null_circuit": bool(abs(f_sel) < 1e-6),  # moves the metric by nothing, to float error
                    "true_circuit_f_pop": f_true, "fold_jaccard": float(sel.extra["fold_circuit_jaccard"][i])})
    return out


def main() -> None:
    """Run the study and print its coverage."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=int, default=50)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--n", type=int, default=48)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--pool", type=int, default=4096)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--k-multiples", type=float, nargs="+", default=[1.0])
    p.add_argument("--out", default=None)
    a = p.parse_args()
    todo = [(r, a.n, a.steps, a.lr, a.folds, a.pool, a.k_multiples) for r in range(a.start, a.start + a.datasets)]
    recs = []
    with Pool(a.jobs) as pool:
        for out in pool.imap_unordered(one_dataset, todo):
            recs += out
            for rec in out:
                print(json.dumps(rec), flush=True)
                if a.out:
                    with open(a.out, "a") as fh:
                        fh.write(json.dumps(rec) + "\n")
    summarise(recs)


def summarise(recs: list[dict]) -> None:
    """Print coverage with its MC SE per k: all datasets, and those whose circuit moves the metric at all."""
    for k in sorted({x["k"] for x in recs}):
        at = [x for x in recs if x["k"] == k]
        for name, sub in (("all", at), ("|f_pop| >= 1e-6", [x for x in at if not x["null_circuit"]])):
            if len(sub) < 2:
                continue
            c = np.array([x["covers"] for x in sub], dtype=float)
            w = np.array([x["hi"] - x["lo"] for x in sub])
            print(f"k={k} {name}: coverage {c.mean():.3f} ± {c.std(ddof=1) / np.sqrt(c.size):.3f} (MC SE) over "
                  f"{c.size} datasets; median width {np.median(w):.2f}; circuit holds the truth on "
                  f"{np.mean([x['contains_truth'] for x in sub]):.2f}; median f_pop {np.median([x['f_pop'] for x in sub]):.2f}")


if __name__ == "__main__":
    main()
