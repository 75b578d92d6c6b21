"""Print docs/verified.md's missed-edges table by predictor: the bound's hold rate and informativeness per method.

Run from the repository root (attribution a minute per population, then the studies, about 10 minutes on a loaded core):
    OMP_NUM_THREADS=1 PYTHONPATH=. python docs/make_missed_predictors.py [CACHE_DIR] [DATASETS]
Populations: planted background 3 (the acceptance's population) and 5 (held out; tests/fixtures/groundtruth-verified-
planted<b>.parquet: exact and EAP, atp-qkfix attributed here on the same prompts by docs/make_verified_multi.py's
planted_predictors, cached in CACHE_DIR, default /tmp/circuitstat-multi-cache, never committed), and the zoo's
attention-only seed-0 model on the zoo fixture's task (held out: induction, n = 1024, seed 12345, seq_len 10). The
zoo model on this machine is not the committed fixture's (another weight hash), so exact, EAP and atp-qkfix are all
attributed here on it: a population of its own.
Protocol (circuitstat.stats.verified.missed_study, as the pipeline's verify stage): D datasets of N = 512 prompts drawn
with replacement, exact on a uniformly random n = 16 of them, the top 5 edges by the first predictor's |mean| plus a
uniformly random 15 of the others; sampled edges classified by TOST with Holm at α/2, the hypergeometric bound at α/2,
level 0.95. One seed per population, so every predictor sees the same prompts, labelled rows and edge-sample stream.
τ = 0.5 on the planted models (the acceptance's), the 95th percentile of |μ| on the zoo. "informative": the bound is
below the unverified count (R − r); MC SE with the dataset as the unit (at a share of 0 or 1 shown as 1 / D, as
MissedStudy.summary does); "vs eap": the paired difference in that share on the same datasets, ± its MC SE.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
from make_verified_multi import planted_predictors  # noqa: E402
from circuitstat.stats.verified.missed_study import missed_edges_study  # noqa: E402

TOP, RANDOM, N, n = 5, 15, 512, 16
PREDICTORS = (("eap",), ("atp-qkfix",), ("eap", "atp-qkfix"), ("atp-qkfix", "eap"))


def zoo_predictors(cache: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Return (exact, {"eap", "atp-qkfix"}) [1024, 81] of this machine's zoo attention-only seed-0 model (cached)."""
    path = cache / "zoo-attn-only-seed0-scores.npz"
    if not path.exists():
        import torch

        from circuitstat.circuits.attribution import attribute
        from circuitstat.pipelines.build import build_task
        from circuitstat.pipelines.sources import LOCAL

        torch.set_num_threads(1)
        model = LOCAL.load("zoo:attn-only-2l/seed-0")
        task = build_task(model, "induction", n=1024, seed=12345, seq_len=10)
        S = {m: attribute(model, task, m, batch_size=64, seed=0, progress=False) for m in ("exact", "eap", "atp-qkfix")}
        assert all(list(v.names) == list(S["exact"].names) for v in S.values())
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(path, weight_hash=model.weight_hash(), **{m.replace("-", "_"): v.scores.astype(np.float64)
                                                            for m, v in S.items()})
    z = np.load(path)
    return z["exact"], {"eap": z["eap"], "atp-qkfix": z["atp_qkfix"]}


def populations(cache: Path) -> dict[str, tuple[np.ndarray, dict[str, np.ndarray], float, int]]:
    """Return {population: (exact, {method: approximation}, τ, seed)}."""
    pops = {"planted bg 3": (*planted_predictors(3, cache), 0.5, 350),
            "planted bg 5 (held out)": (*planted_predictors(5, cache), 0.5, 550)}
    X, P = zoo_predictors(cache)
    pops["zoo induction, retrained here (held out)"] = (X, P, float(np.quantile(np.abs(X.mean(0)), 0.95)), 750)
    return pops


def main(pops: dict, D: int) -> None:
    """Print one markdown row per population and predictor."""
    print("| population | τ | predictor (ranks first) | datasets | hold rate ± MC SE | informative ± MC SE | vs eap "
          "(paired) | median bound of unverified | median truth |\n|---|---|---|---|---|---|---|---|---|")
    for pop, (X, P, tau, seed) in pops.items():
        base = None
        for names in PREDICTORS:
            approx = {m: P[m] for m in names}
            s = missed_edges_study(X, approx, tau=tau, n_top=TOP, n_random=RANDOM, n_prompts=N, n_labelled=n,
                                   n_datasets=D, seed=seed, known=False)
            out = s.summary()
            info = (s.bound < s.n_unverified).astype(float)
            base = info if base is None else base
            d = info - base
            paired = "—" if names == ("eap",) else f"{d.mean():+.3f} ± {d.std(ddof=1) / np.sqrt(D):.3f}"
            p = info.mean()
            print(f"| {pop} | {tau:.3g} | {'+'.join(names)} | {D} | {out['hold_rate']:.3f} ± {out['mc_se']:.3f} | "
                  f"{p:.3f} ± {np.sqrt(max(p * (1 - p), 1.0 / D) / D):.3f} | {paired} | {out['median_bound']:.0f} of "
                  f"{out['median_unverified']:.0f} | {out['median_truth']:.0f} |", flush=True)


def level_sweep(pops: dict, D: int, ranks: range = range(4, 12)) -> None:
    """Print per population and predictor the worst classification error and the lowest hold rate over τ just below
    each of the 5th-12th largest |μ_e| (the TOST's least favourable null |μ| = τ for that edge when it is sampled)."""
    print("| population | predictor | τ values | worst classification error ± MC SE (at τ) | lowest hold rate ± MC SE "
          "(at τ) |\n|---|---|---|---|---|")
    for pop, (X, P, _, seed) in pops.items():
        taus = 0.999 * np.sort(np.abs(X.mean(0)))[::-1][list(ranks)]
        for names in PREDICTORS:
            res = [(t, missed_edges_study(X, {m: P[m] for m in names}, tau=float(t), n_top=TOP, n_random=RANDOM,
                                          n_prompts=N, n_labelled=n, n_datasets=D, seed=seed + 1,
                                          known=False).summary()) for t in taus]
            t_err, err = max(res, key=lambda r: r[1]["classification_error"])
            t_hold, hold = min(res, key=lambda r: r[1]["hold_rate"])
            print(f"| {pop} | {'+'.join(names)} | {len(taus)}: {taus.min():.3g}-{taus.max():.3g} | "
                  f"{err['classification_error']:.3f} ± {err['classification_mc_se']:.3f} ({t_err:.3g}) | "
                  f"{hold['hold_rate']:.3f} ± {hold['mc_se']:.3f} ({t_hold:.3g}) |", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    pops = populations(Path(args[0]) if args else Path("/tmp/circuitstat-multi-cache"))
    D = int(args[1]) if len(args) > 1 else 300
    main(pops, D)
    print()
    level_sweep(pops, D)
