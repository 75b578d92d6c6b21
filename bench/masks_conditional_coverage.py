"""Coverage of the conditional faithfulness interval of a mask-learned circuit (issue 47, item 8), with the dataset as
the unit (a Monte Carlo study, not a timing).

Per dataset r (``--datasets`` of them, N fresh prompt pairs of the planted model's task from seed r): edge pruning is
fitted once on a random half of the N prompts and its top-k circuit (k = each of ``--k-multiples`` x |C|) is the
reported circuit; its Fieller interval on the other half is the conditional interval
(circuitstat.stats.faithfulness_refit.conditional_faithfulness, as the audit's f_conditional columns run it). The truth
is that circuit's ratio-of-means faithfulness on ``--pool`` fresh prompts. The model carries a background effect that no
edge of the planted circuit carries (``background``), and k below |C| leaves out part of the circuit, so the truth is
neither 0 nor 1. Beside it, the in-sample Fieller interval of the circuit fitted on all N prompts, evaluated on the same
N (what a user would compute without splitting), against its own truth.

    OMP_NUM_THREADS=1 python bench/masks_conditional_coverage.py --datasets 60 --n 32 --steps 30 --jobs 2

``--additive``: the same interval on the zoo fixture's real exact scores (tests/fixtures/zoo-induction-exact.parquet,
1024 prompts x 81 edges, heavy-tailed) taken as a finite population, in the additive model m(C) = m(∅) + Σ_{e∈C} s_e
(plus a per-prompt m(∅) noise), where the faithfulness of a top-k circuit is exactly Σ_{e∈C} μ_e / Σ_e μ_e and lies
strictly between 0 and 1. The fit is a stand-in for a mask fit (the top-k of the fit half's mean scores plus a seed's
jitter of 0.05 SD of the means; effects here are negative, so the fit ranks −mean); beside the conditional interval,
the in-sample Fieller interval of the circuit fitted on all N, and the procedure-level cross-fit interval
(f_selected) read as an interval for that circuit.

    python bench/masks_conditional_coverage.py --additive --datasets 1000 --ns 16 32 64 --ks 5 10 20
"""

from __future__ import annotations

import argparse
import json
from multiprocessing import Pool

import numpy as np


def one_dataset(args: tuple) -> list[dict]:
    """The coverage records of dataset ``r`` (one per k)."""
    r, source, n, steps, lr, pool, multiples = args
    import torch

    from circuitstat.circuits.edge_pruning import fit_edge_pruning
    from circuitstat.circuits.faithfulness import faithfulness
    from circuitstat.circuits.groundtruth import load_groundtruth
    from circuitstat.core.seeds import spawn_seeds
    from circuitstat.core.topk import topk_mask
    from circuitstat.pipelines.runs.groundtruth.masks import fold_refit
    from circuitstat.stats.faithfulness_refit import conditional_faithfulness
    from circuitstat.stats.fieller import fieller_faithfulness

    torch.set_num_threads(1)
    gt = load_groundtruth(source)
    task, fresh = gt.task(n, r), gt.task(pool, 10_000_000 + r)
    ks = sorted({max(1, int(round(m * gt.truth.sum()))) for m in multiples})
    opts = {"steps": steps, "lr": lr, "sparsity": 1.0, "init": 1.0}
    s_fit, s_cond = spawn_seeds(r, 2)

    def evaluate(masks, rows):
        res = faithfulness(gt.model, task, masks, rows=rows, progress=False)
        return res.m_circuit, res.m_clean, res.m_empty

    cond = conditional_faithfulness(fold_refit(gt.model, task, np.arange(n), **opts), evaluate, ks, n_obs=n,
                                    seed=s_cond)
    full = fit_edge_pruning(gt.model, task, seed=s_fit, **opts).log_alpha
    insample_masks = np.stack([topk_mask(full, k, ranking="signed", seed=0) for k in ks])
    ins = fieller_faithfulness(*evaluate(insample_masks, np.arange(n)))
    pop = faithfulness(gt.model, fresh, np.vstack([cond.masks, insample_masks]), batch_size=256, progress=False)
    den = (pop.m_clean - pop.m_empty).mean()
    f_pop = (pop.m_circuit - pop.m_empty[:, None]).mean(0) / den
    out = []
    for i, k in enumerate(ks):
        t, t_in = float(f_pop[i]), float(f_pop[len(ks) + i])
        lo, hi = float(cond.interval.low[i]), float(cond.interval.high[i])
        out.append({"dataset": r, "n": n, "k": k, "estimate": float(cond.estimate[i]), "lo": lo, "hi": hi,
                    "shape": str(cond.interval.shape[i]), "f_pop": t, "covers": lo <= t <= hi,
                    "insample_lo": float(ins.low[i]), "insample_hi": float(ins.high[i]), "insample_f_pop": t_in,
                    "insample_covers": bool(ins.low[i] <= t_in <= ins.high[i])})
    return out


def summarise(recs: list[dict]) -> None:
    """Print coverage with its MC SE per k, the share of bounded sets, and the in-sample interval's coverage beside it."""
    for k in sorted({x["k"] for x in recs}):
        at = [x for x in recs if x["k"] == k]
        c = np.array([x["covers"] for x in at], dtype=float)
        ci = np.array([x["insample_covers"] for x in at], dtype=float)
        f = np.array([x["f_pop"] for x in at])
        b = [x for x in at if x["shape"] == "bounded"]
        w = np.median([x["hi"] - x["lo"] for x in b]) if b else float("nan")
        se = lambda v: v.std(ddof=1) / np.sqrt(v.size)  # noqa: E731
        print(f"k={k}: conditional coverage {c.mean():.3f} ± {se(c):.3f} (MC SE) over {c.size} datasets, bounded "
              f"{len(b) / len(at):.2f}, median width {w:.3f}; f_pop median {np.median(f):.3f} "
              f"[{f.min():.3f}, {f.max():.3f}], share with 0.02 < f_pop < 0.98: {np.mean((f > .02) & (f < .98)):.2f}; "
              f"in-sample interval {ci.mean():.3f} ± {se(ci):.3f}")


def additive_study(datasets: int, ns: list[int], ks: list[int]) -> None:
    """Coverage of the reported circuit's faithfulness on the zoo fixture's additive population, per N and k."""
    import sys
    from pathlib import Path

    from circuitstat.core.topk import topk_mask
    from circuitstat.stats.faithfulness_refit import conditional_faithfulness, refit_selection_faithfulness
    from circuitstat.stats.fieller import fieller_faithfulness

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from fixture_populations import load_zoo_fixture

    pop = load_zoo_fixture()[0].astype(np.float64)
    mu = pop.mean(0)
    jitter = 0.05 * mu.std()
    for n in ns:
        hits = {name: np.zeros(len(ks)) for name in ("conditional", "in-sample", "procedure")}
        bounded, truths = np.zeros(len(ks)), []
        for r in range(datasets):
            rng = np.random.default_rng([n, r])
            X, base = pop[rng.integers(0, len(pop), n)], rng.normal(0, 0.1 * abs(mu.sum()), n)

            def evaluate(masks, rows):
                return X[rows] @ masks.T.astype(float) + base[rows, None], X[rows].sum(1) + base[rows], base[rows]

            def refit(rows, seed):
                return -X[rows].mean(0) + np.random.default_rng(seed).normal(size=mu.size) * jitter

            c = conditional_faithfulness(refit, evaluate, ks, n_obs=n, seed=r)
            t = np.array([mu[m].sum() / mu.sum() for m in c.masks])
            truths.append(t)
            hits["conditional"] += (c.interval.low <= t) & (t <= c.interval.high)
            bounded += c.interval.shape == "bounded"
            full = refit(np.arange(n), np.random.SeedSequence([n, r, 1]))
            ms = np.stack([topk_mask(full, k, ranking="signed", seed=0) for k in ks])
            t_in = np.array([mu[m].sum() / mu.sum() for m in ms])
            ins = fieller_faithfulness(*evaluate(ms, np.arange(n)))
            hits["in-sample"] += (ins.low <= t_in) & (t_in <= ins.high)
            pr = refit_selection_faithfulness(refit, full, evaluate, ks, n_obs=n, n_folds=4, seed=r)
            hits["procedure"] += (pr.confidence_interval.low <= t_in) & (t_in <= pr.confidence_interval.high)
        T = np.array(truths)
        for i, k in enumerate(ks):
            cov = {name: h[i] / datasets for name, h in hits.items()}
            se = np.sqrt(0.95 * 0.05 / datasets)
            print(f"N={n} k={k}: conditional {cov['conditional']:.3f} (bounded {bounded[i] / datasets:.3f}); in-sample "
                  f"Fieller {cov['in-sample']:.3f}; procedure-level read as the reported circuit's "
                  f"{cov['procedure']:.3f}; MC SE {se:.3f} over {datasets} datasets; f_pop median "
                  f"{np.median(T[:, i]):.3f} [{T[:, i].min():.3f}, {T[:, i].max():.3f}]")


def main() -> None:
    """Run the study and print its coverage."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default="planted:induction?background=1")
    p.add_argument("--datasets", type=int, default=60)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--n", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--lr", type=float, default=0.2)
    p.add_argument("--pool", type=int, default=2048)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--k-multiples", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--out", default=None)
    p.add_argument("--additive", action="store_true")
    p.add_argument("--ns", type=int, nargs="+", default=[16, 32, 64])
    p.add_argument("--ks", type=int, nargs="+", default=[5, 10, 20])
    a = p.parse_args()
    if a.additive:
        additive_study(a.datasets, a.ns, a.ks)
        return
    todo = [(r, a.source, a.n, a.steps, a.lr, a.pool, a.k_multiples) for r in range(a.start, a.start + a.datasets)]
    recs: list[dict] = []
    with Pool(a.jobs) as pool:
        for out in pool.imap_unordered(one_dataset, todo):
            recs += out
            if a.out:
                with open(a.out, "a") as fh:
                    fh.writelines(json.dumps(rec) + "\n" for rec in out)
    summarise(recs)


if __name__ == "__main__":
    main()
